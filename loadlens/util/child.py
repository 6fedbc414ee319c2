"""Run an HTTP server as a child process until it answers its health URL: the demo, benchmarks and tests.

with http_child([sys.executable, "-m", "loadlens.cli", "serve", "--port", str(port)], port) as url:
    ...   # url == "http://127.0.0.1:<port>"; the child is stopped (SIGTERM, then SIGKILL) on exit
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadlens.util.http import http_ok


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to ``proc``'s whole process group (``proc`` started with ``start_new_session``), then SIGKILL to
    whatever of it is left after ``grace_s``, even when the leader already exited: a server's children (vLLM's
    ``EngineCore`` and workers) can outlive it and would hold its memory, its port and its KV cache."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while process_group_alive(proc.pid) and time.monotonic() < deadline:
        proc.poll()  # reap the leader, so a dead one does not keep the group alive as a zombie
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def process_group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (one we may not signal counts as alive)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ChildError(RuntimeError):
    """The child exited or never answered; the message carries the end of its stderr."""


@dataclass(frozen=True)
class Child:
    url: str  # http://127.0.0.1:<port>
    pid: int  # the child's pid (its process group's id too)


@contextlib.contextmanager
def http_child_process(
    argv: Sequence[str],
    port: int,
    *,
    health_path: str = "/health",
    cwd: Path | None = None,
    timeout_s: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[Child]:
    """Start ``argv`` (its own process group, ``env`` added to this environment), wait for
    ``http://127.0.0.1:<port><health_path>`` to answer 200; stop it (SIGTERM, then SIGKILL) when the block ends."""
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=None if env is None else {**os.environ, **env},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while not http_ok(url + health_path):
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
                raise ChildError(f"{argv[2:5]} exited with {proc.returncode}: {err}")
            if time.monotonic() > deadline:
                raise ChildError(f"{argv[2:5]} did not answer {health_path} within {timeout_s:.0f} s")
            time.sleep(0.05)
        yield Child(url, proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@contextlib.contextmanager
def http_child(
    argv: Sequence[str],
    port: int,
    *,
    health_path: str = "/health",
    cwd: Path | None = None,
    timeout_s: float = 30.0,
) -> Iterator[str]:
    """:func:`http_child_process`, yielding only the URL."""
    with http_child_process(argv, port, health_path=health_path, cwd=cwd, timeout_s=timeout_s) as child:
        yield child.url
