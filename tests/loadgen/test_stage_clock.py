"""The stage clock: end reasons, boundaries, windows, drain verdicts (pure: times are passed in)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadgen.profile import Stage
from loadgen.stage_clock import DRAIN, StageClock, drain_limit, drain_verdict, spawn_rate

WARMUP = Stage(name="warmup", warmup=True, users=2, until_requests=5, max_duration=30.0)
TIMED = Stage(name="c8", users=8, duration=10.0)
BOTH = Stage(name="both", users=4, duration=10.0, until_requests=3)


def test_start_enters_the_first_stage_and_forgets_the_last_run() -> None:
    clock = StageClock([WARMUP, TIMED])
    clock.start(100.0)
    clock.advance(101.0, "until_requests")
    clock.start(200.0)
    assert (clock.index, clock.window_start, clock.windows, clock.draining) == (0, 200.0, [], False)


def test_duration_stage_ends_at_its_duration() -> None:
    clock = StageClock([TIMED])
    clock.start(100.0)
    assert clock.end_reason(109.999, finished=0) == ""
    assert clock.end_reason(110.0, finished=0) == "duration"


def test_until_requests_stage_ends_on_its_count_or_at_max_duration() -> None:
    clock = StageClock([WARMUP])
    clock.start(0.0)
    assert clock.end_reason(1.0, finished=4) == ""
    assert clock.end_reason(1.0, finished=5) == "until_requests"
    assert clock.end_reason(29.9, finished=0) == ""
    assert clock.end_reason(30.0, finished=0) == "max_duration"


def test_a_stage_with_both_ends_on_whichever_comes_first_and_names_the_count_first() -> None:
    clock = StageClock([BOTH])
    clock.start(0.0)
    assert clock.end_reason(2.0, finished=3) == "until_requests"
    assert clock.end_reason(10.0, finished=1) == "duration"
    assert clock.end_reason(10.0, finished=3) == "until_requests"
    assert clock.end_reason(700.0, finished=0) == "duration"  # max_duration only caps count-only stages


def test_time_to_boundary_only_within_a_tick() -> None:
    clock = StageClock([TIMED, WARMUP])
    clock.start(0.0)
    assert clock.time_to_boundary(8.9) == 0.0  # more than a tick left: the next tick is early enough
    assert clock.time_to_boundary(9.25) == pytest.approx(0.75)
    assert clock.time_to_boundary(10.0) == 0.0  # already over
    clock.advance(10.0, "duration")
    assert clock.time_to_boundary(10.5) == 0.0  # no duration: nothing to sleep for


def test_advance_records_windows_back_to_back_then_drains() -> None:
    clock = StageClock([WARMUP, TIMED])
    clock.start(100.0)
    assert clock.advance(103.0, "until_requests") is True
    assert (clock.index, clock.window_start, clock.leaves_warmup(0)) == (1, 103.0, True)
    assert clock.advance(113.0, "duration") is False
    assert clock.draining and clock.draining_since == 113.0
    assert [(w.index, w.spec.name, w.start, w.end, w.end_reason) for w in clock.windows] == [
        (0, "warmup", 100.0, 103.0, "until_requests"),
        (1, "c8", 103.0, 113.0, "duration"),
    ]


def test_kept_windows_drop_a_stage_stopped_as_it_began() -> None:
    clock = StageClock([TIMED, BOTH])
    clock.start(0.0)
    clock.advance(10.0, "duration")
    clock.close(10.0, "stopped")
    assert [w.spec.name for w in clock.windows] == ["c8", "both"]
    assert [w.spec.name for w in clock.kept_windows()] == ["c8"]
    clock.windows[-1] = replace(clock.windows[-1], end=12.0)  # stopped after running 2 s: kept
    assert [w.spec.name for w in clock.kept_windows()] == ["c8", "both"]


def test_leaves_warmup_only_from_a_warmup_to_a_measured_stage() -> None:
    clock = StageClock([WARMUP, Stage(name="w2", warmup=True, users=1, duration=1.0), TIMED])
    clock.start(0.0)
    clock.advance(1.0, "until_requests")
    assert clock.leaves_warmup(0) is False
    clock.advance(2.0, "duration")
    assert clock.leaves_warmup(1) is True


@pytest.mark.parametrize(
    ("waited", "users", "await_reports", "verdict"),
    [
        (0.0, 0, False, "done"),  # local: done as soon as the users are gone
        (0.0, 0, True, "wait"),  # distributed: the last worker report is still to come
        (3.49, 0, True, "wait"),
        (3.5, 0, True, "done"),
        (41.0, 2, False, "wait"),  # 30 s graceful stop + 2 reports + 5 s
        (41.01, 2, True, "timeout"),
    ],
)
def test_drain_verdict(waited: float, users: int, await_reports: bool, verdict: str) -> None:
    assert drain_verdict(waited, users, stop_timeout_s=30.0, report_interval=3.0, await_reports=await_reports) == (
        verdict
    )


def test_drain_limit_and_spawn_rate() -> None:
    assert drain_limit(30.0, 3.0) == 41.0
    assert spawn_rate(TIMED) == 100.0
    assert spawn_rate(Stage(name="big", users=400, duration=1.0)) == 400.0
    assert spawn_rate(Stage(name="slow", users=400, duration=1.0, spawn_rate=2.5)) == 2.5
    assert DRAIN == "(drain)"
