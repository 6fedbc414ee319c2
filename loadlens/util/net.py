"""Small networking helpers shared by the CLI, the demo, tests and benchmarks."""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 15000
"""Ports handed out lie between this and the kernel's ephemeral range, above every port the stack uses."""
RESERVE_S = 600
"""A port handed out is not handed out again by this function, in any process of this user, for 10 to 20 minutes:
longer than any server here takes from its start to its bind (vLLM's CPU build: under a minute)."""
_pick = random.SystemRandom()


def reservation_dir() -> Path:
    """Where picks are recorded, one empty file per port and period: shared by every process of this user."""
    return Path(tempfile.gettempdir()) / f"loadlens-ports-{os.getuid()}"


def _reserve(port: int, directory: Path, now: float) -> bool:
    """Record ``port`` as handed out, unless another caller did in this period or the last one.

    A record is the file ``<port>.<period>``, created with O_EXCL, so of two processes that draw the same port at
    the same moment exactly one gets it. Periods (not file ages) make that true for a stale record too; older
    records of the port are removed on the way. Where the directory cannot be written, every port counts as free
    (the bind check below still applies)."""
    period = int(now // RESERVE_S)
    if (directory / f"{port}.{period - 1}").exists():
        return False
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(directory / f"{port}.{period}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except OSError:
        return True
    os.close(fd)
    for old in directory.glob(f"{port}.*"):
        if old.suffix[1:].isdigit() and int(old.suffix[1:]) < period - 1:
            old.unlink(missing_ok=True)
    return True


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's range for ``bind(port 0)`` and outgoing connections; None where it cannot be read."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def free_port(
    host: str = "127.0.0.1",
    *,
    ephemeral: tuple[int, int] | None = None,
    reservations: Path | None = None,
    now: float | None = None,
) -> int:
    """A TCP port that was free a moment ago, for a server the caller starts next.

    Chosen at random below the kernel's ephemeral range (Linux: from 32768) when that leaves room: a port from
    ``bind(port 0)`` goes back to the pool the kernel hands to every other ``bind(port 0)`` and every outgoing
    connection, so on a busy machine (a test suite on two workers) another server or a client socket could take
    it before the caller's server binds it, and the caller's readiness check then reaches someone else's server.
    Below that range only another caller of this function could pick the same port before the first caller's
    server binds it (a test suite draws a few hundred ports on two workers, each a second or more before its
    server binds: an estimated one run in fifty or more would meet such a pair): each pick is therefore
    recorded in :func:`reservation_dir` and not handed out again for :data:`RESERVE_S` (``reservations``, ``now``:
    for tests).
    """
    ephemeral = ephemeral or ephemeral_range()
    directory = reservations or reservation_dir()
    at = time.time() if now is None else now
    if ephemeral is not None and ephemeral[0] - LOWEST >= 1000:
        for _ in range(50):
            port = _pick.randrange(LOWEST, ephemeral[0])
            if not _reserve(port, directory, at):
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
