"""Process attribution for GPU processes: name (NVML) and container / pod (``/proc/<pid>/cgroup``).

>>> parse_cgroup("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222_"
...              "333344445555.slice/cri-containerd-" + "ab" * 32 + ".scope\\n")
('abababababababababababababababababababababababababababababababab', '1a2b3c4d-0000-1111-2222-333344445555')

Lookups are cached per pid and the cache is pruned to the pids still on a GPU at every scrape, so it stays
as small as the GPU process list. Reads are bounded (64 KiB per file). With the sim backend the pids are
simulated, so the cgroup lookup is off (``proc_root=None``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")
_MAX_READ = 64 * 1024
MAX_NAME_LENGTH = 128


def parse_cgroup(text: str) -> tuple[str, str]:
    """(container_id, pod_uid) from a /proc/<pid>/cgroup file; empty strings where absent.

    Handles cgroup v1 and v2 lines, the cgroupfs and systemd drivers, and docker, containerd and CRI-O ids.
    """
    container = pod = ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        if not path:
            continue
        if not pod:
            m = _POD.search(path)
            if m:
                pod = m.group(1).replace("_", "-")
        if not container:
            m = _CONTAINER.search(path)
            if m:
                container = m.group(1)
        if container and pod:
            break
    return container, pod


class ProcessResolver:
    """Cached (name, container_id, pod_uid) per pid. ``name_of`` returns None on failure; failures are not
    cached, so a process whose name could not be read is asked again next scrape."""

    def __init__(self, proc_root: str | Path | None = "/proc") -> None:
        self._proc = Path(proc_root) if proc_root is not None else None
        self._cache: dict[int, tuple[str, str, str]] = {}

    def labels(self, pid: int, name_of: Callable[[int], str | None]) -> tuple[str, str, str]:
        cached = self._cache.get(pid)
        if cached is not None:
            return cached
        name = name_of(pid)
        container, pod = self.cgroup(pid)
        if name is None:
            return "", container, pod
        result = self._cache[pid] = (name[:MAX_NAME_LENGTH], container, pod)
        return result

    def cgroup(self, pid: int) -> tuple[str, str]:
        if self._proc is None:
            return "", ""
        try:
            with open(self._proc / str(pid) / "cgroup", encoding="utf-8", errors="replace") as f:
                return parse_cgroup(f.read(_MAX_READ))
        except OSError:
            return "", ""  # exited, another pid namespace, or no permission: no container labels

    def prune(self, live: Iterable[int]) -> None:
        keep = set(live)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]
