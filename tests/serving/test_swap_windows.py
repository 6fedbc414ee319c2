"""Swap-window attribution on constructed timelines (exact values), and the bounded window log."""

from __future__ import annotations

import asyncio
import threading

import pytest

from exporters.serving.engine import EngineError, ErrorKind
from exporters.serving.engines.openai.swap_windows import SwapWindow, SwapWindows, blocked_seconds, progress_marks


def w(start: float, end: float, op: str = "load") -> SwapWindow:
    return SwapWindow(start, end, "a", "load" if op == "load" else "unload")


# Marks: admitted at 0.0, tokens at 1.0, 1.1, 1.2, then a stall until 2.0, then 2.1 (the last token).
MARKS = [0.0, 1.0, 1.1, 1.2, 2.0, 2.1]


@pytest.mark.parametrize(
    ("windows", "expected"),
    [
        ([], 0.0),
        ([w(1.25, 1.75)], 0.5),  # inside one stall: the whole window
        ([w(1.15, 1.75)], 0.55),  # started before the last token: only from that token (1.2) on
        ([w(0.5, 0.9)], 0.4),  # between admission and the first token
        ([w(-1.0, 0.5)], 0.5),  # started before admission: from admission on
        ([w(-2.0, -1.0)], 0.0),  # ended before admission
        ([w(1.9, 2.05)], 0.05),  # ended after the 2.0 token: only the stall it ended in (2.0 .. 2.05)
        ([w(2.05, 2.1)], 0.0),  # ended exactly at the last token: the request was no longer waiting
        ([w(2.05, 3.0)], 0.0),  # ended after the stream
        ([w(1.3, 1.5), w(1.4, 1.7)], 0.4),  # overlapping windows in one stall: their union (1.3 .. 1.7)
        ([w(1.3, 1.4), w(1.5, 1.6, "unload")], 0.2),  # disjoint windows in one stall: both
        ([w(0.2, 0.4), w(1.3, 1.4)], 0.3),  # windows in different stalls add up
        ([w(1.0, 1.0)], 0.0),  # an empty window
    ],
)
def test_blocked_seconds_on_constructed_timelines(windows: list[SwapWindow], expected: float) -> None:
    assert blocked_seconds(MARKS, windows) == pytest.approx(expected, abs=1e-12)


def test_no_tokens_yet_blocks_nothing() -> None:
    assert blocked_seconds([5.0], [w(4.0, 6.0)]) == 0.0
    assert SwapWindows().blocked(progress_marks(5.0)) == 0.0


def test_the_log_matches_the_pure_function() -> None:
    log = SwapWindows()
    for window in (w(1.3, 1.5), w(0.2, 0.4), w(1.4, 1.7), w(5.0, 6.0)):
        log.record(window.start, window.end, window.adapter, window.operation)
    assert [x.end for x in log.snapshot()] == [0.4, 1.5, 1.7, 6.0]  # ordered by end
    assert log.ending_between(0.4, 1.7) == [w(0.2, 0.4), w(1.3, 1.5)]
    marks = progress_marks(MARKS[0])
    marks.extend(MARKS[1:])
    assert log.blocked(marks) == pytest.approx(0.2 + 0.4)


def test_the_log_is_bounded_by_count_and_age() -> None:
    log = SwapWindows(max_windows=3, max_age_s=10.0)
    for end in (1.0, 2.0, 3.0, 4.0):
        log.record(end - 0.5, end, "a", "load")
    assert [x.end for x in log.snapshot()] == [2.0, 3.0, 4.0]
    log.record(14.5, 15.0, "a", "unload")  # 2.0 and 3.0 ended more than 10 s before 15.0
    assert [x.end for x in log.snapshot()] == [15.0]
    with pytest.raises(ValueError, match="ends before it starts"):
        log.record(2.0, 1.0, "a", "load")


def test_the_log_is_thread_safe() -> None:
    log = SwapWindows(max_windows=100_000)

    def feed(k: int) -> None:
        for i in range(2000):
            log.record(float(i), float(i) + 0.5 + k * 1e-3, f"a{k}", "load")

    threads = [threading.Thread(target=feed, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ends = [x.end for x in log.snapshot()]
    assert len(ends) == 8000 and ends == sorted(ends)


def test_timed_records_answered_calls_only() -> None:
    log = SwapWindows()

    async def ok() -> str:
        await asyncio.sleep(0.01)
        return "done"

    async def refused() -> None:
        raise EngineError(ErrorKind.UPSTREAM, "bad adapter", status=400)

    async def unreachable() -> None:
        raise EngineError(ErrorKind.UNAVAILABLE, "connection refused")

    async def main() -> None:
        assert await log.timed("a", "load", ok()) == "done"
        with pytest.raises(EngineError):
            await log.timed("b", "load", refused())
        with pytest.raises(EngineError):
            await log.timed("c", "unload", unreachable())

    asyncio.run(main())
    got = log.snapshot()
    assert [(x.adapter, x.operation) for x in got] == [("a", "load"), ("b", "load")]
    assert got[0].end - got[0].start >= 0.01
