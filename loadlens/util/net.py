"""Small networking helpers shared by the CLI, the demo, tests and benchmarks."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 15000
"""Ports handed out lie between this and the kernel's ephemeral range, above every port the stack uses."""
_pick = random.SystemRandom()


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's range for ``bind(port 0)`` and outgoing connections; None where it cannot be read."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def free_port(host: str = "127.0.0.1", *, ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port that was free a moment ago, for a server the caller starts next.

    Chosen at random below the kernel's ephemeral range (Linux: from 32768) when that leaves room: a port from
    ``bind(port 0)`` goes back to the pool the kernel hands to every other ``bind(port 0)`` and every outgoing
    connection, so on a busy machine (a test suite on two workers) another server or a client socket could take
    it before the caller's server binds it, and the caller's readiness check then reaches someone else's server.
    Below that range only another caller of this function can pick the same port: one chance in thousands.
    """
    ephemeral = ephemeral or ephemeral_range()
    if ephemeral is not None and ephemeral[0] - LOWEST >= 1000:
        for _ in range(50):
            port = _pick.randrange(LOWEST, ephemeral[0])
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
