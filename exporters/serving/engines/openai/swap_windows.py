"""LoRA hot-swap windows and the blocking they cause to streaming requests (guide 2.4), for engines that do
not see the upstream's scheduler (the ``openai`` proxy).

A *swap window* is an interval ``[start, end]`` on ``time.monotonic()`` during which the upstream was
swapping an adapter. The proxy records one per ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` call it
forwards (from sending the call to getting its answer, :meth:`SwapWindows.timed`); anything else that knows
swap windows (an in-process engine plugin) may :meth:`SwapWindows.record` them into the same log.

Attribution (:func:`blocked_seconds`). A request's *progress marks* are its admission and the arrival of each
of its output-token chunks. Between two consecutive marks ``a < b`` its stream is stalled. A window
``[s, e]`` blocks the request when ``a <= e < b`` for two consecutive marks, i.e. the request was in flight
and still waiting for its next token when the swap ended; the blocking is that stall's overlap with the window,
``e - max(s, a)``. When several windows end inside one stall, the union of those overlaps counts once.
Windows that end before admission or at/after the request's last token block nothing. This is what the sim
charges (``t1 - max(t0, queued)`` to every request in the engine when its loop unblocks), with the request's
last progress before the window's end in place of its queueing time.
"""

from __future__ import annotations

import bisect
import threading
import time
from array import array
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from exporters.serving.engine import EngineError, ErrorKind

SwapOperation = Literal["load", "unload"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SwapWindow:
    start: float
    end: float
    adapter: str
    operation: SwapOperation


class SwapWindows:
    """A bounded, thread-safe log of swap windows, ordered by end. Windows that ended more than ``max_age_s``
    before the newest one, and the oldest beyond ``max_windows``, are pruned (a request longer than
    ``max_age_s`` loses attribution for the windows pruned under it)."""

    def __init__(self, *, max_windows: int = 4096, max_age_s: float = 3600.0) -> None:
        self.max_windows = max_windows
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._ends: list[float] = []
        self._windows: list[SwapWindow] = []
        self.in_flight = 0
        """Calls :meth:`timed` is awaiting (event loop only): a read stamped while one is in flight may be
        competing with its end for the same loop turn."""

    def __len__(self) -> int:
        return len(self._windows)

    def record(self, start: float, end: float, adapter: str, operation: SwapOperation) -> None:
        if end < start:
            raise ValueError(f"swap window ends before it starts: {start} > {end}")
        window = SwapWindow(start, end, adapter, operation)
        with self._lock:
            i = bisect.bisect_right(self._ends, end)
            self._ends.insert(i, end)
            self._windows.insert(i, window)
            cut = max(
                len(self._ends) - self.max_windows, bisect.bisect_left(self._ends, self._ends[-1] - self.max_age_s)
            )
            if cut > 0:
                del self._ends[:cut], self._windows[:cut]

    def ending_between(self, first: float, last: float) -> list[SwapWindow]:
        """Windows whose end lies in ``[first, last)``, by end."""
        with self._lock:
            return self._windows[bisect.bisect_left(self._ends, first) : bisect.bisect_left(self._ends, last)]

    def snapshot(self) -> list[SwapWindow]:
        with self._lock:
            return list(self._windows)

    async def timed(self, adapter: str, operation: SwapOperation, call: Awaitable[T]) -> T:
        """Await a forwarded swap call and record its window, also when the upstream refused it (it handled
        the call meanwhile); not when the upstream could not be reached (it did nothing)."""
        start = time.monotonic()
        self.in_flight += 1
        try:
            result = await call
        except EngineError as err:
            if err.kind is not ErrorKind.UNAVAILABLE:
                self.record(start, time.monotonic(), adapter, operation)
            raise
        finally:
            self.in_flight -= 1
        self.record(start, time.monotonic(), adapter, operation)  # no await between the stamp and the record
        return result

    def blocked(self, marks: Sequence[float]) -> float:
        """:func:`blocked_seconds` of one request against the log."""
        if len(marks) < 2:
            return 0.0
        return blocked_seconds(marks, self.ending_between(marks[0], marks[-1]))


def progress_marks(admitted: float) -> array[float]:
    """A request's progress marks, starting with its admission; append ``time.monotonic()`` per token chunk."""
    return array("d", (admitted,))


def blocked_seconds(marks: Sequence[float], windows: Sequence[SwapWindow]) -> float:
    """Seconds the request with these progress marks (admission, then each token chunk's arrival,
    non-decreasing) was blocked by ``windows`` (the module docstring defines it)."""
    if len(marks) < 2:
        return 0.0
    by_stall: dict[int, list[tuple[float, float]]] = {}
    for w in windows:
        i = bisect.bisect_right(marks, w.end)  # marks[i - 1] <= end < marks[i]
        if 0 < i < len(marks):
            lo = max(w.start, marks[i - 1])
            if w.end > lo:
                by_stall.setdefault(i, []).append((lo, w.end))
    total = 0.0
    for spans in by_stall.values():
        spans.sort()
        cur_lo, cur_hi = spans[0]
        for lo, hi in spans[1:]:
            if lo > cur_hi:
                total += cur_hi - cur_lo
                cur_lo, cur_hi = lo, hi
            else:
                cur_hi = max(cur_hi, hi)
        total += cur_hi - cur_lo
    return total
