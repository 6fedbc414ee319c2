from __future__ import annotations

from pathlib import Path

import pytest

from exporters.gpu.procinfo import MAX_NAME_LENGTH, ProcessResolver, parse_cgroup

CID = "0123456789abcdef" * 4
POD = "0d4e2c1a-9f3b-4c5d-8e7f-a1b2c3d4e5f6"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ("", "")),
        ("0::/user.slice/user-1000.slice/session-2.scope\n", ("", "")),
        # cgroup v2, systemd driver, containerd
        (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
         f"cri-containerd-{CID}.scope\n", (CID, POD)),
        # cgroup v1, cgroupfs driver
        (f"12:memory:/kubepods/burstable/pod{POD}/{CID}\n11:cpu:/kubepods/burstable/pod{POD}/{CID}\n", (CID, POD)),
        # plain docker, v1 and v2
        (f"4:devices:/docker/{CID}\n", (CID, "")),
        (f"0::/system.slice/docker-{CID}.scope\n", (CID, "")),
        # CRI-O
        (f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{CID}.scope\n", (CID, POD)),
    ],
)  # fmt: skip
def test_parse_cgroup(text: str, expected: tuple[str, str]) -> None:
    assert parse_cgroup(text) == expected


def test_resolver_caches_and_prunes(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    cgroup = tmp_path / "42" / "cgroup"
    cgroup.write_text(f"0::/docker/{CID}\n")
    r = ProcessResolver(tmp_path)
    calls: list[int] = []

    def name_of(pid: int) -> str | None:
        calls.append(pid)
        return "python3"

    assert r.labels(42, name_of) == ("python3", CID, "")
    cgroup.write_text("0::/\n")
    assert r.labels(42, name_of) == ("python3", CID, "")  # cached while the pid stays on the GPU
    assert calls == [42]
    r.prune([7])
    assert r.labels(42, name_of) == ("python3", "", "")
    assert r.cgroup(43) == ("", "")  # no such process


def test_resolver_names() -> None:
    r = ProcessResolver(None)
    calls: list[int] = []

    def name_of(pid: int) -> str | None:
        calls.append(pid)
        return None if pid == 2 else "x" * 500

    assert r.labels(1, name_of) == ("x" * MAX_NAME_LENGTH, "", "")
    assert r.labels(1, name_of) == ("x" * MAX_NAME_LENGTH, "", "")
    assert r.labels(2, name_of) == ("", "", "")
    assert r.labels(2, name_of) == ("", "", "")
    assert calls == [1, 2, 2]  # failures are not cached
    assert r.cgroup(1) == ("", "")  # no proc root: lookups off
