"""benchmarks/host_drift.py: fixed work timed in windows, the spread of the windows' medians."""

from __future__ import annotations

import itertools
import json
import os
import statistics
from pathlib import Path

import pytest

from benchmarks.host_drift import main, measure, summarise


def test_the_summary_of_window_medians() -> None:
    values = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0, 20.0]
    s = summarise(values)
    # p5 at position 0.5 (10.5), p95 at 9.5 (19.5): linear interpolation between order statistics.
    assert (s["median_ms"], s["p5_ms"], s["p95_ms"], s["min_ms"], s["max_ms"]) == (15.0, 10.5, 19.5, 10.0, 20.0)
    assert s["spread"] == pytest.approx(19.5 / 10.5 - 1)
    assert s["max_over_min"] == pytest.approx(1.0)
    assert summarise([5.0])["spread"] == 0.0
    with pytest.raises(ValueError, match="no windows"):
        summarise([])


def test_a_short_run_writes_its_windows_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "drift.json"
    cpu = min(os.sched_getaffinity(0))
    argv = ["--seconds", "0.6", "--window-s", "0.2", "--size", "32", "--memory-mib", "1", "--cpu", str(cpu),
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    windows = doc["windows"]
    assert (doc["size"], doc["memory_mib"], doc["window_s"], doc["cpu"]) == (32, 1, 0.2, cpu)
    # Each window lasts at least --window-s and starts before --seconds ran out (how many fit is the host's
    # business: a descheduled child can spend the whole run in one; the windows' clock is tested below).
    starts = [w["start_s"] for w in windows]
    assert len(windows) >= 1 and starts[0] == 0.0 and starts[-1] < 0.6
    assert all(later - earlier >= 0.2 for earlier, later in zip(starts, starts[1:], strict=False))
    assert all(w["calls"] >= 1 and w["compute_ms"] > 0 and w["memory_ms"] > 0 for w in windows)
    assert set(doc["summary"]) == {"compute", "memory"}
    assert doc["summary"]["memory"]["median_ms"] == statistics.median(w["memory_ms"] for w in windows)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"host drift: one thread on CPU {cpu}, {len(windows)} windows of 0.2 s; steal ")
    assert printed[1].startswith("  compute (32x32 product): median ") and printed[2].startswith(
        "  memory (1 MiB read): median "
    )


def test_windows_close_on_the_clock() -> None:
    """A clock that moves 10 ms a reading: each pass of the two works reads it four times (40 ms), so a 200 ms
    window holds five passes of 10 ms each, and the next starts at the next reading."""
    ticks = itertools.count()
    windows = measure(8, 1, 0.6, 0.2, None, clock=lambda: next(ticks) / 100)
    assert [w.start_s for w in windows] == pytest.approx([0.0, 0.22, 0.44])
    assert [w.calls for w in windows] == [5, 5, 5]
    assert all(w.compute_ms == pytest.approx(10.0) and w.memory_ms == pytest.approx(10.0) for w in windows)


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--window-s", "0"], "must be positive"),
        (["--seconds", "1", "--window-s", "2"], "--window-s at most --seconds"),
        (["--cpu", "4096"], "--cpu 4096: not a CPU this process may run on"),
    ],
)
def test_bad_flags_exit_2_naming_the_cause(argv: list[str], reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert reason in capsys.readouterr().err
