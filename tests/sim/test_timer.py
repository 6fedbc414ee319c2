"""The deadline timer: never early, replaceable, and gone after close()."""

from __future__ import annotations

import asyncio
import time

from exporters.serving.engines.sim.timer import DeadlineTimer
from tests.sim.helpers import run


def test_wakes_at_or_after_the_deadline_with_its_value() -> None:
    async def body() -> None:
        timer = DeadlineTimer(asyncio.get_running_loop())
        for _ in range(5):
            when = time.monotonic() + 0.003
            assert await timer.sleep_until(when) == when
            assert time.monotonic() >= when
        past = time.monotonic() - 1.0
        assert await timer.sleep_until(past) == past  # already due: resolved at once
        timer.close()

    run(body())


def test_a_new_deadline_replaces_the_pending_one() -> None:
    async def body() -> None:
        timer = DeadlineTimer(asyncio.get_running_loop())
        stale = timer.sleep_until(time.monotonic() + 60.0)
        fresh = timer.sleep_until(time.monotonic() + 0.002)
        await asyncio.wait_for(fresh, 5.0)
        assert not stale.done()
        timer.close()

    run(body())


def test_close_ends_the_thread() -> None:
    async def body() -> None:
        timer = DeadlineTimer(asyncio.get_running_loop())
        timer.sleep_until(time.monotonic() + 60.0)
        timer.close()
        await asyncio.to_thread(timer._thread.join, 5.0)
        assert not timer._thread.is_alive()

    run(body())
