"""The stage clock (master or local process): which stage runs, since when, why it ended, when to stop.

Pure: the caller passes wall-clock times and finished-request counts, and does the sleeping. A duration stage
ends exactly on time (the caller sleeps up to the boundary when it is less than a tick away); an
``until_requests`` stage ends once enough of its requests finished; a request-count stage without a duration
ends at ``max_duration``; with ``--stop-on-oversaturation`` an over-saturated stage ends the run
(``stop``). After the last stage the clock drains: users stop, the last worker reports arrive, then the run
is over.
"""

from __future__ import annotations

from collections.abc import Sequence

from loadgen.profile import Stage
from loadgen.results import StageWindow

DRAIN = "(drain)"
"""Window name for what happens after the last stage (never a stage name: parentheses are not allowed there)."""
TICK_S = 1.0
"""Locust calls the shape's tick about once a second."""
DRAIN_GRACE_S = 5.0


class StageClock:
    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)
        self.index = 0
        self.window_start = 0.0
        self.windows: list[StageWindow] = []
        self.draining_since: float | None = None
        self.stopped_early = False
        """``stop`` ended the run before its last stage (``--stop-on-oversaturation``)."""

    @property
    def stage(self) -> Stage:
        return self.stages[self.index]

    @property
    def draining(self) -> bool:
        return self.draining_since is not None

    def start(self, now: float) -> None:
        """A new run: forget the last one and enter the first stage."""
        self.windows = []
        self.draining_since = None
        self.stopped_early = False
        self.enter(0, now)

    def enter(self, index: int, now: float) -> None:
        self.index = index
        self.window_start = now

    def elapsed(self, now: float) -> float:
        return now - self.window_start

    def time_to_boundary(self, now: float) -> float:
        """Seconds to sleep so that a duration stage ends on time; 0 when its end is a tick or more away."""
        duration = self.stage.duration
        if duration is None:
            return 0.0
        left = duration - self.elapsed(now)
        return left if 0 < left < TICK_S else 0.0

    def end_reason(self, now: float, finished: int) -> str:
        """Why the current stage is over ('' while it is not): its request count, duration or max_duration."""
        stage = self.stage
        elapsed = self.elapsed(now)
        if stage.until_requests is not None and finished >= stage.until_requests:
            return "until_requests"
        if stage.duration is not None and elapsed >= stage.duration:
            return "duration"
        if stage.duration is None and elapsed >= stage.max_duration:
            return "max_duration"
        return ""

    def close(self, now: float, reason: str) -> None:
        """Record the current stage's window, ending now for ``reason``."""
        self.windows.append(StageWindow(self.index, self.stage, self.window_start, now, reason))

    def advance(self, now: float, reason: str) -> bool:
        """Close the current stage; enter the next one (True) or start draining after the last one (False)."""
        self.close(now, reason)
        if self.index + 1 < len(self.stages):
            self.enter(self.index + 1, now)
            return True
        self.draining_since = now
        return False

    def stop(self, now: float, reason: str) -> None:
        """Close the current stage for ``reason`` and drain, skipping the stages after it."""
        self.close(now, reason)
        self.draining_since = now
        self.stopped_early = self.index + 1 < len(self.stages)

    def leaves_warmup(self, previous: int) -> bool:
        """Whether going from stage ``previous`` to the current one leaves the warmup for measured stages."""
        return self.stages[previous].warmup and not self.stage.warmup

    def kept_windows(self) -> list[StageWindow]:
        """The windows for the results: a stage stopped the moment it began has nothing to say."""
        return [w for w in self.windows if w.duration > 0 or w.end_reason != "stopped"]


def drain_verdict(
    waited: float, users: int, *, stop_timeout_s: float, report_interval: float, await_reports: bool
) -> str:
    """After the last stage: 'done' once users are gone (and, distributed, the last reports are in),
    'timeout' when they did not stop in time, else 'wait'."""
    if users == 0 and (not await_reports or waited >= report_interval + 0.5):
        return "done"
    if waited > drain_limit(stop_timeout_s, report_interval):
        return "timeout"
    return "wait"


def drain_limit(stop_timeout_s: float, report_interval: float) -> float:
    """The longest drain: the users' graceful stop, two worker reports, and a margin."""
    return stop_timeout_s + 2 * report_interval + DRAIN_GRACE_S


def spawn_rate(stage: Stage) -> float:
    """The spawn rate Locust gets: the stage's own, else fast enough to reach its users within a tick."""
    return stage.spawn_rate or max(100.0, float(stage.user_count))
