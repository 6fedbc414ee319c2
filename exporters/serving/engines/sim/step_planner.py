"""When the sim plans a step (docs/sim-engine.md §6, ``async_scheduling``). Between steps, as vLLM's CPU build
and its synchronous scheduler do: a step takes the requests that arrived by its start. With the knob on, as vLLM
0.32's GPU builds do by default: the engine core plans a step while the one before it runs (its batch queue of
two), so a step that directly follows another takes only the requests that arrived by that one's start; a
request arriving during a step waits for the step already planned and enters the one after. A step that follows
no step in flight (after idleness, an adapter operation, a window, or a late wake-up that moved the schedule) is
planned when it starts, and so is one whose early plan came out empty (vLLM then plans again at once).

Usage::

    batch = planner.plan(scheduler, t0, admit=True, async_scheduling=k.async_scheduling)
    ...  # price and run the step
    planner.ran(t0, next_start)
"""

from __future__ import annotations

from exporters.serving.engines.sim.sched_types import ScheduledBatch
from exporters.serving.engines.sim.scheduler import Scheduler


class StepPlanner:
    def __init__(self) -> None:
        self._start: float | None = None
        """The start of the last step run, when the next one follows it directly."""
        self._end: float | None = None
        """Where the schedule went on after that step."""

    def plan(self, sched: Scheduler, t0: float, *, admit: bool, async_scheduling: bool) -> ScheduledBatch:
        """The batch of the step starting at ``t0``."""
        follows = async_scheduling and self._start is not None and self._end == t0
        cutoff = self._start if follows and self._start is not None else t0
        batch = sched.schedule(cutoff, admit=admit)
        if not batch and cutoff < t0:
            batch = sched.schedule(t0, admit=admit)
        self._start = self._end = None
        return batch

    def ran(self, start: float, next_start: float) -> None:
        """A step started at ``start`` ran; the schedule goes on at ``next_start``."""
        self._start, self._end = start, next_start
