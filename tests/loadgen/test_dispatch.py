"""Open-loop schedules and slot hand-out: exact arrival times, stage changes, void slots (threading stand-ins)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from loadgen.dispatch import Event, OpenLoopSchedule, Slot, StageDispatch, schedule_for
from loadgen.profile import Stage
from tests.loadgen.conftest import EventWatch

CLOSED = Stage(name="closed", users=4, duration=10.0)
CONSTANT = Stage(name="const", rate=4.0, arrival="constant", duration=10.0)
POISSON = Stage(name="pois", rate=2.0, arrival="poisson", duration=10.0)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_constant_schedule_is_evenly_spaced_from_its_offset() -> None:
    schedule = OpenLoopSchedule(4.0, "constant", 10.0, random.Random(1), offset=0.125)
    assert [schedule.take() for _ in range(4)] == [10.125, 10.375, 10.625, 10.875]


def test_poisson_schedule_draws_exponential_gaps_from_its_rng() -> None:
    schedule = OpenLoopSchedule(2.0, "poisson", 10.0, random.Random(7), offset=5.0)
    twin = random.Random(7)
    expected = [10.0 + twin.expovariate(2.0)]
    for _ in range(2):
        expected.append(expected[-1] + twin.expovariate(2.0))
    assert [schedule.take() for _ in range(3)] == expected  # the offset applies to constant spacing only


def test_schedule_for_splits_the_rate_and_interleaves_workers() -> None:
    assert schedule_for(CLOSED, 1, 0.0) is None
    first = schedule_for(CONSTANT, 1, 0.0, share=0.5, worker_index=0)
    second = schedule_for(CONSTANT, 1, 0.0, share=0.5, worker_index=1)
    assert first is not None and second is not None
    assert [first.take() for _ in range(3)] == [0.0, 0.5, 1.0]
    assert [second.take() for _ in range(3)] == [0.25, 0.75, 1.25]  # the two workers together: 4 req/s


def test_schedule_for_is_seeded_by_run_seed_stage_and_worker() -> None:
    def times(seed: int, worker: int) -> list[float]:
        schedule = schedule_for(POISSON, seed, 0.0, worker_index=worker)
        assert schedule is not None
        return [schedule.take() for _ in range(3)]

    assert times(3, 0) == times(3, 0)
    assert times(3, 0) != times(4, 0) and times(3, 0) != times(3, 1)
    rng = random.Random("arrivals:3:pois:0")
    assert times(3, 0)[0] == rng.expovariate(2.0)


class ElapsingEvent:
    """A stage-change event nobody sets: ``wait(timeout)`` lets ``timeout`` pass on the fake clock at once (and
    records it), as a real wait that times out would."""

    def __init__(self, clock: FakeClock, waits: list[float | None]) -> None:
        self.clock = clock
        self.waits = waits

    def set(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        assert timeout is not None, "a wait for ever on a fake clock never ends"
        self.clock.now += timeout
        return False


def dispatch(
    perf: FakeClock | None = None, wall: FakeClock | None = None, new_event: Callable[[], Event] = threading.Event
) -> StageDispatch:
    return StageDispatch(
        [CLOSED, CONSTANT, POISSON],
        seed=1,
        lock=threading.Lock(),
        new_event=new_event,
        perf=perf or time.perf_counter,
        wall=wall or time.time,
    )


def test_apply_maps_the_masters_wall_clock_start_to_perf_counter() -> None:
    perf, wall = FakeClock(50.0), FakeClock(1_000_000.0)
    d = dispatch(perf, wall)
    d.apply(1, start_wall=999_999.5)  # the stage began 0.5 s ago on the master
    assert (d.index, d.gen, d.started_perf, d.stage.name) == (1, 1, 49.5, "const")
    assert d.schedule is not None and d.schedule.next_at == 49.5
    d.apply(1, start_wall=1_000_001.0)  # a start in the future (clock skew) counts as now
    assert (d.gen, d.started_perf) == (2, 50.0)
    d.apply(0, start_wall=1_000_000.0)
    assert d.schedule is None


def test_claim_hands_out_due_and_overdue_slots_at_once() -> None:
    perf, wall = FakeClock(50.0), FakeClock(100.0)
    d = dispatch(perf, wall)
    assert d.claim() is None  # closed loop
    d.apply(1, start_wall=99.0)  # 1 s ago at 4 req/s: arrivals at 49.0, 49.25, ... are overdue
    slots = [d.claim() for _ in range(5)]
    assert slots == [Slot(49.0 + 0.25 * i, "const", 1) for i in range(5)]


def test_claim_sleeps_until_the_next_arrival() -> None:
    perf, wall = FakeClock(50.0), FakeClock(100.0)
    waits: list[float | None] = []
    d = dispatch(perf, wall, lambda: ElapsingEvent(perf, waits))
    d.apply(1, start_wall=100.2)  # the start lies in the future: treated as now
    first = d.claim()
    assert waits == []  # the first arrival is due at once
    second = d.claim()
    assert first is not None and second is not None
    assert second.at - first.at == pytest.approx(0.25)
    # The second claim slept until its arrival, 0.25 s, in one wait that a stage change could have cut short.
    assert waits == [pytest.approx(0.25)] and perf.now == pytest.approx(second.at)


def test_a_stage_change_wakes_the_waiting_sender() -> None:
    watch = EventWatch()
    d = dispatch(new_event=watch.new_event)
    d.apply(2, start_wall=time.time())
    assert d.schedule is not None
    d.schedule.next_at = time.perf_counter() + 60.0  # the next arrival is a minute away
    got: list[Slot | None] = []
    sender = threading.Thread(target=lambda: got.append(d.claim()), daemon=True)
    sender.start()
    assert watch.began.wait(timeout=10)  # the sender is waiting for that arrival ...
    d.apply(0, start_wall=time.time())  # ... when the stage changes to closed loop: it gives up at once
    sender.join(timeout=10)  # far less than the minute it would wait without the wake-up
    assert not sender.is_alive() and got == [None]


def test_admits() -> None:
    perf = FakeClock(50.0)
    d = dispatch(perf, FakeClock(100.0))
    assert d.admits(None) is True  # closed loop needs no slot
    d.apply(1, start_wall=100.0)
    assert d.admits(None) is False  # open loop: claim a slot first
    assert d.admits(Slot(50.0, "const", 1)) is True
    d.apply(2, start_wall=100.0)  # gen 2, started at perf 50.0
    assert d.admits(Slot(49.9, "const", 1)) is True  # due before the change: it still goes out, late
    assert d.admits(Slot(50.0, "const", 1)) is False  # due after its stage ended: void
