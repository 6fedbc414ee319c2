"""A sandbox that runs a deployment's processes as its containers would run: one network, names resolved.

Kubernetes and docker compose cannot run here. What their manifests configure can, though: each container's
command and environment, the names it dials, the ports it listens on, and what Prometheus and Alertmanager do
with it. :func:`run` starts processes inside fresh network, PID and mount namespaces
(``unshare --net --mount --pid``), with these properties:

- the namespace's loopback plays every pod or container address;
- a bind-mounted ``/etc/hosts`` resolves the deployment's service names to that loopback, and so does a DNS
  server on it (``/etc/resolv.conf`` is bind-mounted too), like Docker's embedded DNS;
- the ports are the manifests' own, and nothing outside the namespace can collide with them.

``tests/support/netns_supervisor.py`` is the namespace's init. It starts the processes, restarts those that
exit (like a kubelet or compose's ``restart:``), and forwards each listening port to a Unix socket, through
which the test process reaches it (like ``kubectl port-forward``). It also stands in for the OpenTelemetry
Collector's OTLP/HTTP receiver on 4318, since the Collector cannot be installed here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.support.paths import ROOT

T = TypeVar("T")
PROMETHEUS_PORT = 9090
OTLP_HTTP_PORT = 4318


def available(*tools: str) -> str | None:
    """Why a sandbox cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (unshare --net --mount --pid)"
    for tool in ("unshare", "ip", *tools):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "--pid", "--mount-proc", "--fork", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"cannot create namespaces: {probe.stderr.strip()}"
    return None


@dataclass
class Process:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    ports: list[int] = field(default_factory=list)


def hosts_file(names: Sequence[str]) -> str:
    return "".join(f"127.0.0.1 {n}\n" for n in ["localhost", *names])


def loadlens_bin() -> str:
    return str(Path(sys.executable).parent / "loadlens")


class Sandbox:
    """A running sandbox; ``get(port, path)`` reaches a port inside it."""

    def __init__(self, workdir: Path, proc: subprocess.Popen[bytes]) -> None:
        self.workdir = workdir
        self.proc = proc
        self._clients: dict[int, httpx.Client] = {}

    def client(self, port: int) -> httpx.Client:
        if port not in self._clients:
            transport = httpx.HTTPTransport(uds=str(self.workdir / "sock" / f"{port}.sock"))
            self._clients[port] = httpx.Client(transport=transport, base_url="http://sandbox", timeout=5.0)
        return self._clients[port]

    def get(self, port: int, path: str) -> httpx.Response:
        return self.client(port).get(path)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query against the sandbox's Prometheus (on 9090)."""
        body = self.client(PROMETHEUS_PORT).get("/api/v1/query", params={"query": expr}).json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def otlp_exports(self) -> int:
        path = self.workdir / "otlp-exports"
        return int(path.read_text()) if path.exists() else 0

    def wait(self, what: str, check: Callable[[], T | None], timeout: float) -> T:
        """Poll ``check`` each second until it returns something truthy; fail the test with every log if not."""
        import pytest

        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                result = check()
            except (OSError, httpx.HTTPError, ValueError, KeyError) as err:  # not listening yet, not JSON yet
                result, last = None, err
            if result:
                return result
            time.sleep(1.0)
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})\n{self.logs()}")

    def scraped(self, expr: str, timeout: float = 30) -> list[float]:
        """The values of ``expr`` once Prometheus has scraped them (a target's first scrape can lag its start)."""
        result = self.wait(f"a scrape answering {expr}", lambda: self.query(expr), timeout)
        return [float(r["value"][1]) for r in result]

    def restarts(self) -> dict[str, int]:
        path = self.workdir / "restarts.json"
        return dict(json.loads(path.read_text())) if path.exists() else {}

    def assert_no_restarts_but(self, *allowed: str) -> None:
        """Nothing restarted, except processes that exit by design until a dependency answers."""
        restarted = {name: n for name, n in self.restarts().items() if n and name not in allowed}
        assert restarted == {}, f"restarted: {restarted}\n{self.logs()}"

    def logs(self) -> str:
        out = []
        for path in sorted((self.workdir / "logs").glob("*.log")):
            out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        if self.proc.poll() is None:
            # unshare, and the supervisor it forked, share this process group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


@contextlib.contextmanager
def run(processes: Sequence[Process], names: Sequence[str], workdir: Path) -> Iterator[Sandbox]:
    """Start ``processes`` in a sandbox where every name in ``names`` resolves to its loopback."""
    for d in ("logs", "sock"):
        (workdir / d).mkdir(parents=True, exist_ok=True)
    (workdir / "hosts").write_text(hosts_file(names))
    (workdir / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    spec = {
        "processes": [p.__dict__ for p in processes],
        "base_env": {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"}},
        "forward": sorted({port for p in processes for port in p.ports}),
        "otlp_sink_port": OTLP_HTTP_PORT,
        "dns_names": list(names),
        "workdir": str(workdir),
    }
    (workdir / "spec.json").write_text(json.dumps(spec, indent=2))
    script = (
        f"mount --bind {workdir / 'hosts'} /etc/hosts && mount --bind {workdir / 'resolv.conf'} /etc/resolv.conf && "
        "ip link set lo up && "
        f"exec {sys.executable} -m tests.support.netns_supervisor {workdir / 'spec.json'}"
    )
    proc = subprocess.Popen(
        # A PID namespace too: the supervisor is its init, so when it ends the kernel ends every process left.
        ["unshare", "--net", "--mount", "--pid", "--mount-proc", "--fork", "sh", "-c", script],
        cwd=ROOT,
        stdout=(workdir / "logs" / "supervisor.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    sandbox = Sandbox(workdir, proc)
    try:
        deadline = time.monotonic() + 20
        while not (workdir / "sock" / "ready").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"supervisor did not start (rc={proc.poll()}):\n{sandbox.logs()}")
            time.sleep(0.1)
        yield sandbox
    finally:
        sandbox.close()
