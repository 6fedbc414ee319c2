"""Virtual time for the sim (its tests, and ``loadlens calibrate``'s replays): an asyncio loop whose clock
stands still while anything is ready to run and jumps to the next timer when nothing is, and a
:class:`~exporters.serving.engines.sim.timer.Timer` on that loop's own timers. An engine built on them
(``make_engine`` in tests/sim/helpers.py does so on this loop) wakes exactly at its modeled deadlines, and a
test's ``asyncio.sleep(0.005)`` lasts exactly 5 ms of the engine's time, however busy the
machine is: marks equal modeled instants, and the order of arrivals and steps is fixed by the script.

How late the real timer wakes is not tested here: ``tests/sim/test_timer.py`` checks it is never early, and
``benchmarks/sim_engine.py`` measures its lateness (timing error p50/p99).

Usage::

    async def body() -> None:
        engine, reg = make_engine(speed=20.0)      # clock=loop.time, timer=LoopTimer
        ...
    run_virtual(body())

No threads: the loop jumps whenever it has nothing ready, so a thread's work would be overtaken by time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

START = 1000.0
"""Virtual seconds at the start. Away from 0 (a mark of 0.0 would read as falsy) and large enough that
``now + (when - now)`` is exactly ``when`` for every instant below 2000 s (Sterbenz), so the loop lands on a
deadline exactly, not an ulp beside it."""


class _JumpingSelector(selectors.DefaultSelector):
    """Real I/O (and ``call_soon_threadsafe`` wake-ups) without blocking; otherwise moves the loop's clock on by
    the timeout asyncio computed to its next timer, instead of sleeping through it."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer pending: only I/O can wake the loop
            return super().select(None)
        self._loop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """``time()`` is virtual: it starts at :data:`START` and moves only when the loop would otherwise sleep."""

    def __init__(self) -> None:
        self.now = START
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now


def _resolve(fut: asyncio.Future[float], when: float) -> None:
    if not fut.done():
        fut.set_result(when)


class LoopTimer:
    """The engine's timer on ``loop.call_at``: on a :class:`VirtualTimeLoop` it fires at exactly ``when``. As
    ``DeadlineTimer``, a new ``sleep_until`` replaces a pending one (whose future then never resolves)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None

    def sleep_until(self, when: float) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = self._loop.create_future()
        self.close()
        self._handle = self._loop.call_at(when, _resolve, fut, when)
        return fut

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def running_virtual_loop() -> VirtualTimeLoop | None:
    """The running loop if it is a :class:`VirtualTimeLoop` (None outside a loop or on a real one)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return loop if isinstance(loop, VirtualTimeLoop) else None


def run_virtual(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """Run one async test body on a fresh virtual-time loop. ``timeout`` is virtual seconds: a hang fails at
    once (time jumps to it), far from any modeled schedule a test runs."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(bounded())
