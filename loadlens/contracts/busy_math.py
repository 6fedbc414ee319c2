"""The one home of utilisation-swing analysis: from a busy timeline (or evenly spaced utilisation samples) to a
mean, a peak-to-trough, a dominant period and the busy-run / idle-gap distributions (issue 24 item 3).

A *busy timeline* is a list of ``(start, end)`` intervals (seconds, any one clock) in which the device was
running this process's work: forward passes timed with CUDA events or ``perf_counter``
(``exporters.probe.timeline``), vLLM's execute step, or the sim's step schedule. Pure: no I/O, no clock.

Definitions (docs/metrics.md states them beside each series):

- the timeline is first *merged*: overlapping intervals, and intervals separated by less than
  :data:`MERGE_GAP_FRACTION` of a bin, become one busy run (a gap a bin cannot show is not an idle gap);
- ``busy_ratio``: busy seconds / window seconds;
- ``swing_ratio`` (the peak-to-trough): p95 − p5 (nearest rank) of the busy ratio in :data:`SWING_BIN_S`
  (10 ms) bins — 0 for a steady load, near 1 for whole 10 ms stretches on and off;
- ``period_seconds``: the dominant period of the busy ratio in ``resolution``-second bins (default
  :data:`RESOLUTION_S`, 1 ms) from its autocorrelation (:func:`period_with_reason`), else null with a reason
  (:data:`PERIOD_REASONS`);
- busy runs and idle gaps: p50 / p95 / max of the merged runs and of the gaps between them inside the window.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

RESOLUTION_S = 0.001
"""Bin width of the series the period is found in: resolves periods from 2 ms (Nyquist) up."""
SWING_BIN_S = 0.010
"""Bin width of the series the peak-to-trough is taken over (the sim's native utilisation sample)."""
MERGE_GAP_FRACTION = 0.1
"""Gaps shorter than this share of a bin join their neighbours into one busy run."""
MIN_AUTOCORRELATION = 0.3
"""The period is reported only when the autocorrelation at that lag is at least this (else: no cycle)."""
MIN_CYCLES = 4
"""... and the window holds at least this many periods."""
MIN_BINS = 8
FUNDAMENTAL_SHARE = 0.9
"""The first autocorrelation peak at least this share of the highest is the period (its multiples score about
as high; the first of them is the fundamental)."""

PERIOD_REASONS: dict[str, str] = {
    "no_intervals": "no busy interval in the window",
    "too_short": f"fewer than {MIN_BINS} bins in the window",
    "flat": "the busy ratio does not vary between bins (always busy, always idle, or a cycle faster than a bin)",
    "below_nyquist": "the median cycle (busy run + idle gap) is shorter than two bins: not resolvable",
    "no_cycle": f"no autocorrelation peak of at least {MIN_AUTOCORRELATION} after its first drop below zero, "
    f"within 1/{MIN_CYCLES} of the window",
}
"""Why ``period_seconds`` is null: code -> meaning (the codes are what the documents and results carry)."""

Interval = tuple[float, float]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank on the index ``int(q · (n − 1))`` of the sorted values."""
    return sorted_values[int(q * (len(sorted_values) - 1))]


def _autocorrelation(values: Sequence[float]) -> list[float] | None:
    """acf[k] = Σ dev[i]·dev[i+k] / Σ dev² for k < n (biased: the longer the lag, the fewer the terms), or
    None for a flat series. numpy's FFT when importable (a 10 s window of 1 ms bins is 10 000 values), the
    same sums in Python otherwise (used only for short series)."""
    n = len(values)
    mean = math.fsum(values) / n
    dev = [v - mean for v in values]
    var = math.fsum(d * d for d in dev)
    if var <= 1e-12 * n:
        return None
    try:
        import numpy as np
    except ImportError:
        return [sum(dev[i] * dev[i + k] for i in range(n - k)) / var for k in range(n // MIN_CYCLES + 2)]
    size = 1 << (2 * n - 1).bit_length()
    spectrum = np.fft.rfft(np.asarray(dev, dtype=np.float64), size)
    acf = np.fft.irfft(spectrum * np.conj(spectrum), size)[: n // MIN_CYCLES + 2] / var
    return [float(x) for x in acf]


def period_with_reason(values: Sequence[float], interval: float) -> tuple[float | None, str | None]:
    """The dominant period (seconds) of an evenly sampled series: the lag of the highest autocorrelation after
    its first drop below zero, up to a :data:`MIN_CYCLES`-th of the series, if that autocorrelation is at least
    :data:`MIN_AUTOCORRELATION` (the first local peak within :data:`FUNDAMENTAL_SHARE` of it, so noise never
    promotes a multiple of the period); else ``(None, reason)`` with a code of :data:`PERIOD_REASONS`. The shortest
    period a series can show is two of its intervals (Nyquist); a faster cycle averages away ("flat") or
    aliases into a longer one, which only the timeline's own runs and gaps can tell (:func:`busy_stats`)."""
    n = len(values)
    if n < MIN_BINS:
        return None, "too_short"
    acf = _autocorrelation(values)
    if acf is None:
        return None, "flat"
    longest = n // MIN_CYCLES
    crossing = next((k for k in range(1, longest + 1) if acf[k] < 0), None)
    if crossing is None:
        return None, "no_cycle"
    best = max(range(crossing + 1, longest + 1), key=lambda k: acf[k], default=None)
    if best is None or acf[best] < MIN_AUTOCORRELATION:
        return None, "no_cycle"
    # The fundamental, not a multiple that noise lifted a little higher: the first local peak near the highest.
    first = next(
        k
        for k in range(crossing + 1, best + 1)
        if acf[k] >= FUNDAMENTAL_SHARE * acf[best] and acf[k] >= acf[k - 1] and acf[k] >= acf[k + 1]
    )
    return first * interval, None


def swing_period(values: list[float], interval: float) -> float | None:
    """:func:`period_with_reason` without the reason."""
    return period_with_reason(values, interval)[0]


def util_figures(samples: list[tuple[float, float]], interval: float | None) -> dict[str, float | None]:
    """From ``(timestamp s, busy %)`` samples of the measured window: mean, p5, p95, peak-to-trough = p95 − p5,
    the swing period (ms) and the sample interval (ms): the multi_lora experiment's ``util.*`` (coarse
    utilisation samples; the fine timeline's figures are :func:`busy_figures`)."""
    values = [v for _, v in samples]
    if not values or interval is None:
        keys = ("mean_pct", "p5_pct", "p95_pct", "peak_to_trough_pct", "swing_period_ms", "interval_ms", "samples")
        return {f"util.{k}": None for k in keys}
    ordered = sorted(values)
    period = swing_period(values, interval)
    return {
        "util.mean_pct": statistics.fmean(values),
        "util.p5_pct": percentile(ordered, 0.05),
        "util.p95_pct": percentile(ordered, 0.95),
        "util.peak_to_trough_pct": percentile(ordered, 0.95) - percentile(ordered, 0.05),
        "util.swing_period_ms": None if period is None else period * 1000.0,
        "util.interval_ms": interval * 1000.0,
        "util.samples": float(len(values)),
    }


def merge(intervals: Sequence[Interval], lo: float, hi: float, min_gap: float = 0.0) -> list[Interval]:
    """The busy runs inside ``[lo, hi)``: intervals clipped to it, sorted, overlapping ones and ones less than
    ``min_gap`` apart joined."""
    runs: list[list[float]] = []
    for start, end in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if end <= start:
            continue
        if runs and (start <= runs[-1][1] or start - runs[-1][1] < min_gap):
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    return [(s, e) for s, e in runs]


def _numpy() -> object | None:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def binned(runs: Sequence[Interval], lo: float, hi: float, width: float) -> list[float]:
    """Busy ratio (0-1) of each ``width``-second bin of ``[lo, hi)`` (the last partial bin dropped), from
    merged runs."""
    n = int((hi - lo) / width + 1e-9)
    if n <= 0:
        return []
    if runs and _numpy() is not None:
        import numpy as np

        # Busy seconds before each bin edge from the runs' cumulative lengths: one vectorised pass.
        starts = np.fromiter((s for s, _ in runs), dtype=np.float64, count=len(runs))
        ends = np.fromiter((e for _, e in runs), dtype=np.float64, count=len(runs))
        done = np.concatenate(([0.0], np.cumsum(ends - starts)))
        edges = lo + width * np.arange(n + 1, dtype=np.float64)
        k = np.searchsorted(ends, edges, side="right")  # runs ended by each edge
        partial = np.where(k < len(runs), np.clip(edges - starts[np.minimum(k, len(runs) - 1)], 0.0, None), 0.0)
        before = done[k] + partial
        return [min(1.0, max(0.0, float(v))) for v in np.diff(before) / width]
    out = [0.0] * n
    for start, end in runs:
        first = max(0, int((start - lo) / width))
        last = min(n - 1, int((end - lo) / width))
        for b in range(first, last + 1):
            b_lo = lo + b * width
            overlap = min(end, b_lo + width) - max(start, b_lo)
            if overlap > 0:
                out[b] += overlap / width
    return [min(1.0, v) for v in out]


@dataclass(frozen=True, slots=True)
class Spread:
    p50: float
    p95: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        ordered = sorted(values)
        return Spread(percentile(ordered, 0.5), percentile(ordered, 0.95), ordered[-1])


@dataclass(frozen=True, slots=True)
class BusyStats:
    """The figures of one window of a busy timeline (see the module's definitions)."""

    window_seconds: float
    resolution_seconds: float
    swing_bin_seconds: float
    intervals: int  # busy runs after merging
    busy_seconds: float
    busy_ratio: float
    swing_ratio: float | None  # None: the window holds fewer than one swing bin
    period_seconds: float | None
    period_reason: str | None  # a code of PERIOD_REASONS when period_seconds is None
    busy_run: Spread | None
    idle_gap: Spread | None
    gaps: tuple[float, ...]  # the idle gaps themselves (seconds), for a histogram


def busy_stats(
    intervals: Sequence[Interval],
    lo: float,
    hi: float,
    *,
    resolution: float = RESOLUTION_S,
    swing_bin: float = SWING_BIN_S,
) -> BusyStats:
    """The figures of the window ``[lo, hi)`` of a busy timeline."""
    if not hi > lo or not resolution > 0 or not swing_bin > 0:
        raise ValueError(f"need hi > lo and positive bins, got [{lo}, {hi}), {resolution}, {swing_bin}")
    window = hi - lo
    runs = merge(intervals, lo, hi, MERGE_GAP_FRACTION * resolution)
    busy = math.fsum(e - s for s, e in runs)
    lengths = [e - s for s, e in runs]
    gaps = [b[0] - a[1] for a, b in zip(runs, runs[1:], strict=False)]
    run_spread, gap_spread = Spread.of(lengths), Spread.of(gaps)
    swing = binned(runs, lo, hi, swing_bin)
    ordered = sorted(swing)
    period: float | None = None
    reason: str | None
    if not runs:
        reason = "no_intervals"
    elif run_spread is not None and gap_spread is not None and run_spread.p50 + gap_spread.p50 < 2 * resolution:
        reason = "below_nyquist"
    else:
        period, reason = period_with_reason(binned(runs, lo, hi, resolution), resolution)
    return BusyStats(
        window_seconds=window,
        resolution_seconds=resolution,
        swing_bin_seconds=swing_bin,
        intervals=len(runs),
        busy_seconds=busy,
        busy_ratio=busy / window,
        swing_ratio=percentile(ordered, 0.95) - percentile(ordered, 0.05) if ordered else None,
        period_seconds=period,
        period_reason=reason,
        busy_run=run_spread,
        idle_gap=gap_spread,
        gaps=tuple(gaps),
    )
