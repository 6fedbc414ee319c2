"""Pure window statistics for the sampler: no I/O, no clocks, table-tested.

>>> percentile([0.0, 10.0], 0.5)
5.0
>>> s = util_stats([(0.0, 0.5), (0.1, 0.9), (0.2, 0.5), (0.3, 0.9)])
>>> round(s.mean, 3), round(s.peak_to_trough, 3), round(s.sample_interval or 0, 3)
(0.7, 0.4, 0.1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Hysteresis for swing detection, as a share of the standard deviation: a crossing must clear mean +/- this
# band, so sampling noise around the mean does not count as a cycle.
SWING_HYSTERESIS = 0.5
# Below this standard deviation (0.5 percentage points) utilisation is flat: no swing period.
MIN_SWING_STDDEV = 0.005


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); ``sorted_values`` must be sorted."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def median_interval(times: Sequence[float]) -> float | None:
    """Median gap between consecutive timestamps: the effective sampling interval."""
    if len(times) < 2:
        return None
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    gaps.sort()
    return percentile(gaps, 0.5)


def swing_period(samples: Sequence[tuple[float, float]], mean: float, stddev: float) -> float | None:
    """Dominant swing period in seconds: mean time between upward crossings of the mean.

    A crossing counts when the value goes from below ``mean - h`` to above ``mean + h`` with
    ``h = SWING_HYSTERESIS * stddev``. Needs two upward crossings. For a quasi-periodic signal this is its
    fundamental period; it cannot be shorter than two sample intervals (the Nyquist limit), which is why the
    sample interval is exported beside it.
    """
    if stddev < MIN_SWING_STDDEV or len(samples) < 4:
        return None
    band = SWING_HYSTERESIS * stddev
    low = mean - band
    high = mean + band
    below: bool | None = None
    ups: list[float] = []
    for t, v in samples:
        if v < low:
            below = True
        elif v > high:
            if below:
                ups.append(t)
            below = False
    if len(ups) < 2:
        return None
    return (ups[-1] - ups[0]) / (len(ups) - 1)


@dataclass(frozen=True, slots=True)
class UtilStats:
    """Utilisation over the window, ratios 0-1. ``peak_to_trough`` is p95 - p5 (robust to single spikes)."""

    samples: int
    mean: float
    min: float
    max: float
    p5: float
    p95: float
    stddev: float
    peak_to_trough: float
    swing_period: float | None
    sample_interval: float | None


def util_stats(samples: Sequence[tuple[float, float]]) -> UtilStats | None:
    """Stats of (time seconds, ratio) samples, oldest first; None for fewer than two samples."""
    n = len(samples)
    if n < 2:
        return None
    values = [v for _, v in samples]
    ordered = sorted(values)
    mean = math.fsum(values) / n
    # Population stddev: the window is the data. fsum keeps exact inputs exact (0.06, not 0.05999...).
    stddev = math.sqrt(math.fsum([(v - mean) * (v - mean) for v in values]) / n)
    p5 = percentile(ordered, 0.05)
    p95 = percentile(ordered, 0.95)
    return UtilStats(
        samples=n,
        mean=mean,
        min=ordered[0],
        max=ordered[-1],
        p5=p5,
        p95=p95,
        stddev=stddev,
        peak_to_trough=p95 - p5,
        swing_period=swing_period(samples, mean, stddev),
        sample_interval=median_interval([t for t, _ in samples]),
    )


@dataclass(frozen=True, slots=True)
class MemoryWindow:
    min_bytes: int
    max_bytes: int
    fluctuation: float | None  # (max - min) / mean; None when the mean is 0


def memory_window(used: Sequence[int]) -> MemoryWindow | None:
    """VRAM fluctuation over the window (guide 2.3 alerts at >= 15 %)."""
    if not used:
        return None
    lo, hi = min(used), max(used)
    mean = math.fsum(used) / len(used)
    return MemoryWindow(lo, hi, (hi - lo) / mean if mean > 0 else None)


class StepDetector:
    """Finds step growth in VRAM: a run of rising readings whose total rise is at least ``threshold`` bytes.

    A run ends at the first reading that does not rise; consecutive rising ticks (one adapter loaded over
    several sampler ticks) make one step. :meth:`update` returns the step size when a step ends.

    >>> d = StepDetector(100)
    >>> [d.update(v) for v in (1000, 1000, 1060, 1120, 1120, 1130, 1130)]
    [None, None, None, None, 120, None, None]
    """

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._prev: int | None = None
        self._run_start: int | None = None

    def update(self, used: int) -> int | None:
        prev, self._prev = self._prev, used
        if prev is None:
            return None
        if used > prev:
            if self._run_start is None:
                self._run_start = prev
            return None
        start, self._run_start = self._run_start, None
        if start is not None and prev - start >= self.threshold:
            return prev - start
        return None
