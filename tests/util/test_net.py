"""free_port hands out ports below the kernel's ephemeral range, where bind(port 0) and clients never land."""

from __future__ import annotations

import socket
from pathlib import Path

from loadlens.util.net import LOWEST, RESERVE_S, _reserve, ephemeral_range, free_port


def test_ports_lie_below_the_ephemeral_range_and_bind() -> None:
    low, _ = ephemeral_range() or (32768, 60999)
    ports = {free_port() for _ in range(50)}
    assert all(LOWEST <= p < low for p in ports)
    assert len(ports) == 50  # never one port twice (reserved), random over thousands of ports
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_taken_port_is_never_handed_out(tmp_path: Path) -> None:
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
        assert taken not in {free_port(ephemeral=window, reservations=tmp_path) for _ in range(300)}


def test_without_room_below_the_range_the_kernel_picks(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("1024\t60999\n")
    assert ephemeral_range(tmp_path / "range") == (1024, 60999)
    assert ephemeral_range(tmp_path / "missing") is None
    port = free_port(ephemeral=(LOWEST + 10, 60999))  # under 1000 ports of room: bind(port 0)
    assert port >= 1024


def test_a_port_handed_out_is_not_handed_out_again_within_the_reservation(tmp_path: Path) -> None:
    window = (LOWEST + 1000, 60999)  # 1000 ports to draw from
    first = {free_port(ephemeral=window, reservations=tmp_path, now=1_000_000.0) for _ in range(400)}
    assert len(first) == 400  # 400 draws, 400 ports: a repeat would be a second server on one port
    later = RESERVE_S  # the next period: the first period's records still hold
    second = {free_port(ephemeral=window, reservations=tmp_path, now=1_000_000.0 + later) for _ in range(400)}
    assert len(second) == 400
    assert not first & second


def test_two_periods_on_a_port_is_free_again_and_its_old_record_goes(tmp_path: Path) -> None:
    period = 5000
    (tmp_path / f"{LOWEST + 7}.{period - 3}").touch()
    (tmp_path / f"{LOWEST + 7}.{period - 1}").touch()
    assert not _reserve(LOWEST + 7, tmp_path, period * RESERVE_S)  # last period's record holds it
    assert not _reserve(LOWEST + 7, tmp_path, (period - 1) * RESERVE_S)  # and this one's, created with O_EXCL
    assert _reserve(LOWEST + 7, tmp_path, (period + 1) * RESERVE_S)  # two periods on: free, older records go
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{LOWEST + 7}.{period + 1}"]


def test_an_unwritable_reservation_directory_leaves_the_bind_check_alone(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    port = free_port(reservations=blocker / "sub")  # cannot be made: a file is in the way
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
