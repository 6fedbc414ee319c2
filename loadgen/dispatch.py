"""Open-loop arrivals and how idle senders claim them; the stage every process is in.

Every process (workers learn it from the master's messages) keeps the current stage here. In an open-loop
stage the process has a schedule of arrival times; idle senders queue on one lock and only its holder sleeps
until the next arrival, so no sender holds a slot far in the future (a stage change would strand it). The
holder takes the slot when it is due, or at once when it is already overdue (every sender was busy: the
request goes out late and is measured from its scheduled time).

The lock, the wake-up event and the clock are passed in: gevent's in Locust processes, threading's in tests.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from loadgen.profile import Stage


@dataclass
class Slot:
    """An open-loop send: its scheduled time (perf_counter), the stage that scheduled it, and that stage's gen."""

    at: float
    stage: str
    gen: int


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


def schedule_for(
    stage: Stage, seed: int, start: float, *, share: float = 1.0, worker_index: int = 0
) -> OpenLoopSchedule | None:
    """This process's share of an open-loop stage's arrivals (None for a closed-loop stage).

    Seeded per run seed, stage and worker, so a rerun sends at the same times; workers interleave their
    constant-rate sends by offsetting each by its index over the full rate.
    """
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
        self.schedule: OpenLoopSchedule | None = None
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
                if delay > 0 and self.changed.wait(delay):
                    continue  # woken by a stage change: look at the new schedule
                return Slot(schedule.take(), self.stage.name, self.gen)

    def admits(self, slot: Slot | None) -> bool:
        """Whether a request may go out now with ``slot``; False sends the user back to claim one."""
        if self.stage.open_loop and slot is None:
            return False  # an open-loop request needs a scheduled arrival
        # A slot scheduled by a stage that ended before its time came is void.
        return slot is None or slot.gen == self.gen or slot.at < self.started_perf
