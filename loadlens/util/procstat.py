"""Process identity from ``/proc``: start time (to tell a reused pid from the original) and PID namespace.

>>> parse_stat_starttime("4242 (python3 (a) b) S 1 4242 4242 0 -1 4194560 " + "0 " * 12 + "987654 0 0")
987654
"""

from __future__ import annotations

import os
from pathlib import Path

_MAX_READ = 4096
# starttime is field 22 of /proc/<pid>/stat; counted after the ")" that closes comm (comm may hold spaces
# and parentheses), it is the 20th.
_STARTTIME_AFTER_COMM = 19


def parse_stat_starttime(text: str) -> int | None:
    _, sep, rest = text.rpartition(")")
    if not sep:
        return None
    fields = rest.split()
    try:
        return int(fields[_STARTTIME_AFTER_COMM])
    except (IndexError, ValueError):
        return None


def start_time_ticks(pid: int | str, proc_root: str | os.PathLike[str] = "/proc") -> int | None:
    """Clock ticks since boot at which ``pid`` started; None when it is gone or not visible."""
    try:
        with open(Path(proc_root) / str(pid) / "stat", encoding="utf-8", errors="replace") as f:
            return parse_stat_starttime(f.read(_MAX_READ))
    except OSError:
        return None


def pid_namespace(pid: int | str = "self", proc_root: str | os.PathLike[str] = "/proc") -> str | None:
    """``pid:[inode]`` of the process's PID namespace; None where it cannot be read."""
    try:
        return os.readlink(Path(proc_root) / str(pid) / "ns" / "pid")
    except OSError:
        return None
