"""free_port hands out ports below the kernel's ephemeral range, where bind(port 0) and clients never land."""

from __future__ import annotations

import socket
from pathlib import Path

from loadlens.util.net import LOWEST, ephemeral_range, free_port


def test_ports_lie_below_the_ephemeral_range_and_bind() -> None:
    low, _ = ephemeral_range() or (32768, 60999)
    ports = {free_port() for _ in range(50)}
    assert all(LOWEST <= p < low for p in ports)
    assert len(ports) > 40  # random over thousands of ports, not a sequence a second caller would repeat
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_taken_port_is_never_handed_out() -> None:
    window = (LOWEST + 1000, 60999)  # picks come from the 1000 ports below LOWEST + 1000
    with socket.socket() as held:
        for port in range(LOWEST, LOWEST + 1000):
            try:
                held.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        held.listen()
        taken = held.getsockname()[1]
        assert taken not in {free_port(ephemeral=window) for _ in range(300)}


def test_without_room_below_the_range_the_kernel_picks(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("1024\t60999\n")
    assert ephemeral_range(tmp_path / "range") == (1024, 60999)
    assert ephemeral_range(tmp_path / "missing") is None
    port = free_port(ephemeral=(LOWEST + 10, 60999))  # under 1000 ports of room: bind(port 0)
    assert port >= 1024
