"""From a busy timeline to a ``busy`` section (loadlens.contracts.probe_document.ProbeBusy): the window's figures
(``loadlens.contracts.busy_math``) and a running histogram of idle gaps, each gap counted once, when the run
after it has been resolved. Used by the in-process probe (its thread, over exporters.probe.timeline) and the
sim's simulated GPU (over its step schedule)."""

from __future__ import annotations

import bisect
import math
from typing import Protocol

from loadlens.contracts.buckets import BUSY_IDLE_GAP_SECONDS
from loadlens.contracts.busy_math import MERGE_GAP_FRACTION, RESOLUTION_S, BusyStats, Spread, busy_stats, merge
from loadlens.contracts.probe_document import BusySpread, ProbeBusy

WINDOW_S = 10.0
"""The window the figures cover, ending at the newest resolved interval (or now, with nothing pending)."""


class Timeline(Protocol):
    """What a report reads of a timeline (exporters.probe.timeline.BusyTimeline has it all)."""

    source: str
    clock: str
    cuda_index: int | None
    recorded_total: int
    busy_seconds_total: float
    dropped_total: int

    @property
    def pending(self) -> int: ...  # intervals recorded but not yet resolved

    def intervals(self, since: float = ...) -> list[tuple[float, float]]: ...


def _spread(s: Spread | None) -> BusySpread | None:
    return None if s is None else BusySpread(p50=s.p50, p95=s.p95, max=s.max)


class BusyReport:
    def __init__(self, timeline: Timeline, *, uuid: str = "", window: float = WINDOW_S) -> None:
        self.timeline = timeline
        self.uuid = uuid
        self.window = window
        self._counts = [0] * len(BUSY_IDLE_GAP_SECONDS)
        self._gaps = 0
        self._gap_sum = 0.0
        self._last_end: float | None = None  # end of the last busy run counted into the histogram

    def _count_gaps(self, intervals: list[tuple[float, float]]) -> None:
        if not intervals:
            return
        since = self._last_end if self._last_end is not None else -math.inf
        lo = intervals[0][0] if self._last_end is None else self._last_end
        runs = merge([iv for iv in intervals if iv[1] > since], lo, math.inf, MERGE_GAP_FRACTION * RESOLUTION_S)
        previous = self._last_end
        for start, end in runs:
            if previous is not None and start - previous >= MERGE_GAP_FRACTION * RESOLUTION_S:
                gap = start - previous
                self._gaps += 1
                self._gap_sum += gap
                index = bisect.bisect_left(BUSY_IDLE_GAP_SECONDS, gap)
                for i in range(index, len(self._counts)):
                    self._counts[i] += 1
            previous = end
        self._last_end = previous

    def stats(self, now: float) -> tuple[BusyStats, float]:
        """The window's figures, and where the window starts."""
        intervals = self.timeline.intervals()
        self._count_gaps(intervals)
        hi = now if self.timeline.pending == 0 or not intervals else intervals[-1][1]
        lo = hi - self.window
        return busy_stats(intervals, lo, hi), lo

    def section(self, now: float) -> ProbeBusy:
        s, lo = self.stats(now)
        t = self.timeline
        return ProbeBusy(
            source=t.source,
            clock=t.clock,  # type: ignore[arg-type]  # one of the two CLOCK_ constants
            cuda_index=t.cuda_index,
            uuid=self.uuid,
            window_start=lo,
            window_seconds=s.window_seconds,
            resolution_seconds=s.resolution_seconds,
            swing_bin_seconds=s.swing_bin_seconds,
            busy_ratio=min(1.0, s.busy_ratio),
            swing_ratio=s.swing_ratio,
            period_seconds=s.period_seconds,
            period_reason=s.period_reason,
            busy_run=_spread(s.busy_run),
            idle_gap=_spread(s.idle_gap),
            intervals_total=t.recorded_total,
            busy_seconds_total=t.busy_seconds_total,
            dropped_total=t.dropped_total,
            idle_gap_bounds=list(BUSY_IDLE_GAP_SECONDS),
            idle_gap_counts=list(self._counts),
            idle_gap_count=self._gaps,
            idle_gap_sum=self._gap_sum,
        )
