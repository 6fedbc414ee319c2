"""Small networking helpers shared by the CLI, the demo, tests and benchmarks."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller binds it next; races are possible but rare)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
