"""Open-loop arrivals and how idle senders claim them; the stage every process is in.

Every process (workers learn it from the master's messages) keeps the current stage here. In an open-loop
stage the process has a schedule of arrival times; idle senders queue on one lock and only its holder sleeps
until the next arrival, so no sender holds a slot far in the future (a stage change would strand it). The
holder takes the slot when it is due, or at once when it is already overdue (every sender was busy: the
request goes out late and is measured from its scheduled time).

A trace stage's schedule is the trace itself: each row is due at the stage's start plus its scaled offset,
and the slot carries the row, whose lengths the request is built to. Workers take every n-th row.

The lock, the wake-up event and the clock are passed in: gevent's in Locust processes, threading's in tests.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Protocol

from loadgen.profile import Stage, TraceReplay
from loadgen.traces import TraceRow


@dataclass
class Slot:
    """An open-loop send: its scheduled time (perf_counter), the stage that scheduled it, and that stage's gen."""

    at: float
    stage: str
    gen: int
    row: TraceRow | None = None
    """A trace stage's row: the request is built to its lengths (and block hashes)."""


class OpenLoopSchedule:
    """Arrival times for this process: constant spacing or Poisson (exponential gaps), from ``start``."""

    def __init__(self, rate: float, arrival: str, start: float, rng: random.Random, offset: float = 0.0) -> None:
        self.rate = rate
        self.constant = arrival == "constant"
        self.rng = rng
        self.next_at = start + (offset if self.constant else rng.expovariate(rate))

    def take(self) -> float:
        at = self.next_at
        self.next_at += 1.0 / self.rate if self.constant else self.rng.expovariate(self.rate)
        return at

    def take_slot(self) -> tuple[float, TraceRow | None]:
        return self.take(), None


class TraceSchedule:
    """A trace's rows for this process (every ``step``-th from ``first``), each due at ``start`` plus its
    scaled offset; ``next_at`` is infinite once they are all taken. A row handed out names its stage and the
    output length to ask for: the recorded one, or one drawn from the trace's ``output_tokens`` (seeded by
    run seed, stage and row)."""

    def __init__(
        self, trace: TraceReplay, start: float, *, stage: str = "", seed: int = 0, first: int = 0, step: int = 1
    ) -> None:
        self.trace = trace
        self.start = start
        self.stage = stage
        self.seed = seed
        self.rows = trace.rows[first::step]
        self.pos = 0

    @property
    def next_at(self) -> float:
        if self.pos >= len(self.rows):
            return math.inf
        return self.start + self.trace.offset(self.rows[self.pos])

    def take_slot(self) -> tuple[float, TraceRow | None]:
        at, row = self.next_at, self.rows[self.pos]
        self.pos += 1
        out = row.output_tokens
        if self.trace.output_tokens is not None:
            out = self.trace.output_tokens.sample(
                random.Random(f"trace-out:{self.seed}:{self.stage}:{row.index}").gauss
            )
        return at, replace(row, stage=self.stage, output_tokens=out)


Schedule = OpenLoopSchedule | TraceSchedule


def schedule_for(
    stage: Stage, seed: int, start: float, *, share: float = 1.0, worker_index: int = 0
) -> Schedule | None:
    """This process's share of an open-loop stage's arrivals (None for a closed-loop stage).

    Seeded per run seed, stage and worker, so a rerun sends at the same times; workers interleave their
    constant-rate sends by offsetting each by its index over the full rate. A trace is split by rows: of n
    workers (share 1/n), worker i replays rows i, i + n, ...
    """
    if stage.trace is not None:
        workers = max(1, round(1.0 / share))
        return TraceSchedule(
            stage.trace, start, stage=stage.name, seed=seed, first=worker_index % workers, step=workers
        )
    if stage.rate is None:
        return None
    rng = random.Random(f"arrivals:{seed}:{stage.name}:{worker_index}")
    return OpenLoopSchedule(stage.rate * share, stage.arrival, start, rng, worker_index / stage.rate)


class Event(Protocol):
    def set(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class StageDispatch:
    """The current stage of this process, its open-loop schedule, and the slot hand-out."""

    def __init__(
        self,
        stages: Sequence[Stage],
        seed: int,
        *,
        lock: AbstractContextManager[object],
        new_event: Callable[[], Event],
        perf: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.stages = tuple(stages)
        self.seed = seed
        self.lock = lock
        self.new_event = new_event
        self.perf = perf
        self.wall = wall
        self.index = 0
        self.gen = 0
        self.started_perf = perf()
        self.schedule: Schedule | None = None
        self.changed = new_event()

    @property
    def stage(self) -> Stage:
        return self.stages[self.index]

    def apply(self, index: int, start_wall: float, *, share: float = 1.0, worker_index: int = 0) -> None:
        """Enter stage ``index``, which began at ``start_wall`` (the master's wall clock)."""
        self.index = index
        self.gen += 1
        # Convert the master's wall-clock start into this process's perf_counter timeline.
        start_perf = self.perf() - max(0.0, self.wall() - start_wall)
        self.started_perf = start_perf
        self.schedule = schedule_for(self.stage, self.seed, start_perf, share=share, worker_index=worker_index)
        changed, self.changed = self.changed, self.new_event()
        changed.set()  # wake the sender waiting for the old schedule's next arrival

    def claim(self) -> Slot | None:
        """Block until the next arrival is due and take it; None in (or on a change to) a closed-loop stage."""
        if self.schedule is None:
            return None
        with self.lock:
            while True:
                schedule = self.schedule
                if schedule is None:
                    return None  # the stage changed to closed loop while we queued
                delay = schedule.next_at - self.perf()
                # A trace with no rows left is due never: only a stage change ends its wait.
                if delay > 0 and self.changed.wait(None if math.isinf(delay) else delay):
                    continue  # woken by a stage change: look at the new schedule
                at, row = schedule.take_slot()
                return Slot(at, self.stage.name, self.gen, row)

    def admits(self, slot: Slot | None) -> bool:
        """Whether a request may go out now with ``slot``; False sends the user back to claim one."""
        if self.stage.open_loop and slot is None:
            return False  # an open-loop request needs a scheduled arrival
        # A slot scheduled by a stage that ended before its time came is void.
        return slot is None or slot.gen == self.gen or slot.at < self.started_perf
