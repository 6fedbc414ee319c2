"""Over-saturation: does a stage's queue, and with it TTFT, grow without bound? (docs/loadgen.md)

A stage is **over-saturated** when two per-second series both trend the wrong way over the stage, each by
a one-sided Mann–Kendall test at ``alpha`` and each by a minimum amount (Theil–Sen slope × the window's
span, against the series' median level):

- *latency*: the mean TTFT of the requests whose first token arrived in each second (every mode);
- *load*: in an **open-loop** stage the requests the load generator holds, per second: in flight plus the
  backlog (arrivals already due that no sender has taken yet) — a server that keeps up holds it level
  (Little's law), one that does not lets it grow by (arrival rate − completion rate) per second. In a
  **closed-loop** stage the users are fixed, so the queue cannot grow there; TTFT can grow only when the
  server's throughput falls (users = throughput × latency), so the load series is the output tokens that
  arrived per second, tested for a *decrease*.

The window is the stage so far minus its first ``settle_fraction`` (the start-up as the new load fills the
server). Mann–Kendall is rank-based (no normality), Theil–Sen is the median of pairwise slopes (a step at
the window's edge barely moves it); the minimum growth keeps significant-but-tiny drifts of a stable
server from counting. Pure: the caller passes the store and the times, and decides what to do.

Usage::

    judgement = judge_stage(store, stage, start=window_start, end=time.time())
    judgement.verdict  # 'over_saturated' | 'stable' | 'not_judged'
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from loadgen.dispatch import OpenLoopSchedule
from loadgen.profile import Stage
from loadgen.results import StageWindow
from loadgen.store import Store

OVER_SATURATED = "over_saturated"
STABLE = "stable"
NOT_JUDGED = "not_judged"
END_REASON = OVER_SATURATED
"""A stage's ``end_reason`` when ``--stop-on-oversaturation`` ended it."""

EVAL_INTERVAL_S = 5.0
"""How often the stage clock's process judges the running stage (each judgement takes milliseconds)."""
CONFIRMATIONS = 2
"""Consecutive live checks that must find a stage over-saturated before it is reported (and stopped)."""
MAX_BACKLOG_LOOKAHEAD = 100_000
"""Most due arrivals counted per sample (a Poisson backlog is counted by replaying the schedule's draws)."""


@dataclass(frozen=True)
class Thresholds:
    """The test's constants, in one place (docs/loadgen.md quotes them)."""

    alpha: float = 0.01
    """One-sided significance level of each Mann–Kendall test."""
    min_window_s: float = 10.0
    """Shortest window (after the settle part) that is judged."""
    min_points: int = 10
    """Fewest seconds with data per series (the normal approximation of Mann–Kendall needs about 10)."""
    settle_fraction: float = 0.1
    """Share of the elapsed stage left out at its start."""
    min_growth_ratio: float = 1.0
    """TTFT and the open-loop load must rise by at least this share of their median level over the window."""
    min_ttft_growth_s: float = 0.05
    """... and TTFT by at least 50 ms."""
    min_queue_growth: float = 4.0
    """... and the open-loop load by at least 4 requests."""
    min_decline_ratio: float = 0.1
    """Closed loop: output tokens per second must fall by at least this share of their median level."""
    max_points: int = 240
    """Longer series are averaged into this many bins (Mann–Kendall and Theil–Sen are O(n²))."""


THRESHOLDS = Thresholds()

Series = list[tuple[float, float]]
"""(seconds since the stage's start, value), in time order."""


@dataclass(frozen=True)
class Trend:
    """One series' test: Mann–Kendall S, its z (continuity- and tie-corrected), the one-sided p-value in the
    tested direction, the Theil–Sen slope (per second), the median ``level`` and the growth along the
    Theil–Sen line (slope × span of the series)."""

    series: str
    direction: str  # increase | decrease
    points: int
    mann_kendall_s: int
    z: float
    p_value: float
    slope_per_s: float
    level: float
    growth: float
    span_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "series": self.series,
            "direction": self.direction,
            "points": self.points,
            "mann_kendall_s": self.mann_kendall_s,
            "z": _round(self.z),
            "p_value": _sig(self.p_value),
            "slope_per_s": _sig(self.slope_per_s),
            "level": _sig(self.level),
            "growth": _sig(self.growth),
            "span_s": _round(self.span_s),
        }


@dataclass(frozen=True)
class Judgement:
    verdict: str
    reason: str
    mode: str  # open | closed
    window_start_s: float
    window_end_s: float
    latency: Trend | None = None
    load: Trend | None = None
    alpha: float = THRESHOLDS.alpha

    @property
    def over_saturated(self) -> bool:
        return self.verdict == OVER_SATURATED


def _round(x: float) -> float | None:
    return round(x, 3) if math.isfinite(x) else None


def _sig(x: float) -> float | None:
    """Four significant digits (p-values span many orders of magnitude)."""
    return float(f"{x:.4g}") if math.isfinite(x) else None


# --- the statistics ---------------------------------------------------------------------------------------


def mann_kendall(ys: Sequence[float]) -> tuple[int, float]:
    """S = Σ_{i<j} sign(y_j − y_i) over a series in time order, and its z: (S ∓ 1) / √Var(S) with
    Var(S) = [n(n−1)(2n+5) − Σ_ties t(t−1)(2t+5)] / 18 (0 when S = 0)."""
    n = len(ys)
    s = 0
    for i in range(n - 1):
        yi = ys[i]
        for yj in ys[i + 1 :]:
            s += (yj > yi) - (yj < yi)
    counts: dict[float, int] = {}
    for y in ys:
        counts[y] = counts.get(y, 0) + 1
    ties = sum(t * (t - 1) * (2 * t + 5) for t in counts.values() if t > 1)
    var = (n * (n - 1) * (2 * n + 5) - ties) / 18.0
    if s == 0 or var <= 0:
        return s, 0.0
    return s, (s - 1 if s > 0 else s + 1) / math.sqrt(var)


def upper_tail(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def theil_sen(points: Series) -> float:
    """The median of the pairwise slopes (y_j − y_i) / (x_j − x_i), i < j."""
    slopes = [
        (yj - yi) / (xj - xi)
        for i, (xi, yi) in enumerate(points)
        for xj, yj in points[i + 1 :]
        if xj > xi
    ]  # fmt: skip
    return median(slopes) if slopes else 0.0


def trend(name: str, points: Series, direction: str = "increase") -> Trend:
    ys = [y for _, y in points]
    s, z = mann_kendall(ys)
    slope = theil_sen(points)
    span = points[-1][0] - points[0][0] if points else 0.0
    p = upper_tail(z) if direction == "increase" else upper_tail(-z)
    return Trend(name, direction, len(points), s, z, p, slope, median(ys) if ys else math.nan, slope * span, span)


def coarsen(points: Series, max_points: int) -> Series:
    """Average consecutive points in groups so that at most ``max_points`` remain."""
    if len(points) <= max_points:
        return list(points)
    k = math.ceil(len(points) / max_points)
    out: Series = []
    for i in range(0, len(points), k):
        group = points[i : i + k]
        out.append((sum(x for x, _ in group) / len(group), sum(y for _, y in group) / len(group)))
    return out


# --- the verdict -----------------------------------------------------------------------------------------

LATENCY_SERIES = "ttft_seconds"
OPEN_LOAD_SERIES = "outstanding_requests"
CLOSED_LOAD_SERIES = "output_tokens_per_second"


def judge(
    mode: str,
    latency: Series,
    load: Series,
    *,
    window: tuple[float, float],
    t: Thresholds = THRESHOLDS,
) -> Judgement:
    """The verdict on two series already cut to ``window`` (seconds since the stage's start)."""
    lo, hi = window
    open_loop = mode == "open"

    def verdict(v: str, reason: str, lat: Trend | None = None, ld: Trend | None = None) -> Judgement:
        return Judgement(v, reason, mode, round(lo, 3), round(hi, 3), lat, ld, t.alpha)

    if hi - lo < t.min_window_s:
        return verdict(NOT_JUDGED, f"window of {hi - lo:.1f} s; the test needs at least {t.min_window_s:g} s")
    load_name = OPEN_LOAD_SERIES if open_loop else CLOSED_LOAD_SERIES
    for name, points in ((LATENCY_SERIES, latency), (load_name, load)):
        if len(points) < t.min_points:
            return verdict(
                NOT_JUDGED, f"{name}: {len(points)} seconds with data; the test needs at least {t.min_points}"
            )
    lat = trend(LATENCY_SERIES, coarsen(latency, t.max_points))
    ld = trend(load_name, coarsen(load, t.max_points), "increase" if open_loop else "decrease")
    failures: list[str] = []
    lat_min = max(t.min_growth_ratio * lat.level, t.min_ttft_growth_s)
    if lat.p_value >= t.alpha:
        failures.append(f"TTFT shows no significant rise (p={lat.p_value:.3g})")
    elif lat.growth < lat_min:
        failures.append(f"TTFT rose {lat.growth * 1e3:.0f} ms, less than {lat_min * 1e3:.0f} ms")
    if open_loop:
        ld_min = max(t.min_growth_ratio * ld.level, t.min_queue_growth)
        if ld.p_value >= t.alpha:
            failures.append(f"outstanding requests show no significant rise (p={ld.p_value:.3g})")
        elif ld.growth < ld_min:
            failures.append(f"outstanding requests rose {ld.growth:.1f}, less than {ld_min:.1f}")
    else:
        ld_min = t.min_decline_ratio * ld.level
        if ld.p_value >= t.alpha:
            failures.append(f"output tokens/s show no significant fall (p={ld.p_value:.3g})")
        elif -ld.growth < ld_min:
            failures.append(f"output tokens/s fell {-ld.growth:.1f}, less than {ld_min:.1f}")
    if failures:
        return verdict(STABLE, "; ".join(failures), lat, ld)
    if open_loop:
        load_text = f"outstanding requests rose {ld.growth:.0f} (p={ld.p_value:.2g})"
    else:
        load_text = f"output tokens/s fell {-ld.growth:.0f} (p={ld.p_value:.2g})"
    reason = f"TTFT rose {lat.growth:.2f} s over {lat.span_s:.0f} s (p={lat.p_value:.2g}) and {load_text}"
    return verdict(OVER_SATURATED, reason, lat, ld)


# --- the series from the store ---------------------------------------------------------------------------


def _bins(bins: Mapping[int, Sequence[float]], start: float, lo: float, hi: float, *, scale: bool) -> Series:
    """Per-second means ``sum / count`` (``scale``: × the most samples any second had, i.e. the sum over all
    processes when one missed a second) for the seconds whose middle lies in [start + lo, start + hi]."""
    most = max((c for _, c in bins.values()), default=0) if scale else 0
    out: Series = []
    for second in sorted(bins):
        x = second + 0.5 - start
        total, count = bins[second]
        if lo <= x <= hi and count > 0:
            out.append((x, total / count * (most if scale else 1)))
    return out


def _full_seconds(counts: Mapping[int, int], start: float, lo: float, hi: float) -> Series:
    """Counts per wall second for the seconds wholly inside [start + lo, start + hi] (zeros included)."""
    first = math.ceil(start + lo)
    last = math.floor(start + hi) - 1
    return [(s + 0.5 - start, float(counts.get(s, 0))) for s in range(first, last + 1)]


def judge_stage(store: Store, stage: Stage, *, start: float, end: float, t: Thresholds = THRESHOLDS) -> Judgement:
    """Judge ``stage`` (which began at wall time ``start``) on what the store holds up to wall time ``end``."""
    elapsed = max(0.0, end - start)
    lo, hi = t.settle_fraction * elapsed, elapsed
    timeline = store.timelines.get(stage.name)
    ttft = _bins(timeline.ttft, start, lo, hi, scale=False) if timeline else []
    if stage.open_loop:
        load = _bins(timeline.queue, start, lo, hi, scale=True) if timeline else []
    else:
        load = _full_seconds(store.tokens_by_second, start, lo, hi)
    return judge("open" if stage.open_loop else "closed", ttft, load, window=(lo, hi), t=t)


def outstanding(in_flight: int, schedule: Any, now: float) -> int:
    """Requests this process holds in an open-loop stage: in flight plus arrivals due by ``now``
    (perf_counter) that no sender has taken. The schedule is not advanced."""
    return in_flight + due_arrivals(schedule, now)


def due_arrivals(schedule: Any, now: float) -> int:
    """Arrivals of an open-loop schedule due by ``now`` and not yet taken: counted from the constant spacing,
    by replaying a Poisson schedule's draws on a copy of its generator, or (a trace stage) by walking its
    remaining rows; at most ``MAX_BACKLOG_LOOKAHEAD``."""
    if schedule is None or schedule.next_at > now:
        return 0
    if isinstance(schedule, OpenLoopSchedule):
        if schedule.constant:
            return min(MAX_BACKLOG_LOOKAHEAD, int((now - schedule.next_at) * schedule.rate) + 1)
        rng = random.Random()
        rng.setstate(schedule.rng.getstate())
        at, due = schedule.next_at, 0
        while at <= now and due < MAX_BACKLOG_LOOKAHEAD:
            due += 1
            at += rng.expovariate(schedule.rate)
        return due
    try:  # a trace's rows in time order, each due at the stage's start plus its scaled offset
        rows, pos, start, offset = schedule.rows, schedule.pos, schedule.start, schedule.trace.offset
    except AttributeError:
        return 1  # a schedule of another kind: at least its next arrival is due
    due = 0
    for row in rows[pos : pos + MAX_BACKLOG_LOOKAHEAD]:
        if start + offset(row) > now:
            break
        due += 1
    return due


# --- the result block ------------------------------------------------------------------------------------


def result_block(judgement: Judgement, detected_at_s: float | None) -> dict[str, Any]:
    """A stage's ``saturation`` object in benchmark_result.json."""
    return {
        "verdict": judgement.verdict,
        "reason": judgement.reason,
        "mode": judgement.mode,
        "alpha": judgement.alpha,
        "window_start_s": judgement.window_start_s,
        "window_end_s": judgement.window_end_s,
        "detected_at_s": None if detected_at_s is None else round(detected_at_s, 3),
        "latency": judgement.latency.as_dict() if judgement.latency else None,
        "load": judgement.load.as_dict() if judgement.load else None,
    }


def stage_blocks(store: Store, windows: Sequence[StageWindow], detected: Mapping[str, float]) -> dict[str, Any]:
    """The ``saturation`` object of every window, judged over the whole stage; ``detected``: stage name →
    seconds into the stage when the live check first found it over-saturated."""
    out: dict[str, Any] = {}
    for w in windows:
        j = judge_stage(store, w.spec, start=w.start, end=w.end)
        at = detected.get(w.spec.name)
        if at is None and j.over_saturated:
            at = w.duration  # found only by the stage-end judgement
        out[w.spec.name] = result_block(j, at)
    return out


class Watch:
    """The live check of the stage clock's process: judge the running stage every ``interval`` seconds; a
    stage counts as over-saturated once ``confirmations`` consecutive checks find it so (a queue's random
    excursion near capacity can pass one check), and ``detected`` remembers when (seconds into the stage)."""

    def __init__(self, interval: float = EVAL_INTERVAL_S, confirmations: int = CONFIRMATIONS) -> None:
        self.interval = interval
        self.confirmations = confirmations
        self.detected: dict[str, float] = {}
        self.streak: dict[str, int] = {}
        self.next_at = 0.0

    def reset(self) -> None:
        self.detected = {}
        self.streak = {}
        self.next_at = 0.0

    def check(self, store: Store, stage: Stage, *, start: float, now: float) -> Judgement | None:
        """The judgement when this check newly finds ``stage`` over-saturated, else None (also when not due)."""
        if now < self.next_at or stage.name in self.detected:
            return None
        self.next_at = now + self.interval
        j = judge_stage(store, stage, start=start, end=now)
        streak = self.streak[stage.name] = self.streak.get(stage.name, 0) + 1 if j.over_saturated else 0
        if streak < self.confirmations:
            return None
        self.detected[stage.name] = now - start
        return j
