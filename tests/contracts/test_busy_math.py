"""The utilisation-swing analysis (loadlens.contracts.busy_math): periods recovered from noisy synthetic
timelines, the null period's reasons, the run / gap distributions, and the coarse-sample figures it also
serves (the multi_lora experiment's util.*)."""

from __future__ import annotations

import builtins
import random
from typing import Any

import pytest

from loadlens.contracts.busy_math import (
    PERIOD_REASONS,
    binned,
    busy_stats,
    merge,
    period_with_reason,
    swing_period,
    util_figures,
)


def on_off(period: float, duty: float, seconds: float, jitter: float, seed: int) -> list[tuple[float, float]]:
    """A periodic load: each cycle's start and busy length moved by Gaussian noise of ``jitter`` seconds."""
    rng = random.Random(seed)
    out, t = [], 0.0
    while t < seconds:
        start = t + rng.gauss(0.0, jitter)
        out.append((start, start + max(period * duty + rng.gauss(0.0, jitter), 0.0005)))
        t += period
    return out


@pytest.mark.parametrize("period", [0.029, 0.084, 0.0295])
@pytest.mark.parametrize("seed", range(5))
def test_the_guides_periods_come_back_from_noisy_timelines(period: float, seed: int) -> None:
    # Guide 2.2's 29 ms and 84 ms swings, and the H200's measured 29.5 ms load (14.6 ms busy of 29.5): 3 s of
    # timeline, each cycle's start and length jittered by 1 ms (sd). Tolerance: one 1 ms bin, the resolution.
    s = busy_stats(on_off(period, 0.5, 3.0, 0.001, seed), 0.0, 3.0)
    assert s.period_reason is None
    assert s.period_seconds == pytest.approx(period, abs=0.001)
    assert s.busy_ratio == pytest.approx(0.5, abs=0.02)
    assert s.swing_ratio == 1.0  # whole 10 ms bins on and off
    assert s.busy_run is not None and s.busy_run.p50 == pytest.approx(period / 2, abs=0.0015)
    assert s.idle_gap is not None and s.idle_gap.p50 == pytest.approx(period / 2, abs=0.0015)


def test_an_exact_timeline_gives_exact_figures() -> None:
    # Busy 3 ms of every 10 ms for 1 s, no noise.
    runs = [(k * 0.010, k * 0.010 + 0.003) for k in range(100)]
    s = busy_stats(runs, 0.0, 1.0)
    assert (s.intervals, s.period_seconds, s.period_reason) == (100, pytest.approx(0.010), None)
    assert s.busy_seconds == pytest.approx(0.3) and s.busy_ratio == pytest.approx(0.3)
    assert s.swing_ratio == pytest.approx(0.0)  # every 10 ms bin holds one 3 ms run: steady at that scale
    assert s.busy_run is not None and (s.busy_run.p50, s.busy_run.max) == (pytest.approx(0.003), pytest.approx(0.003))
    assert s.idle_gap is not None and s.idle_gap.p95 == pytest.approx(0.007)
    assert len(s.gaps) == 99


@pytest.mark.parametrize(
    ("intervals", "reason"),
    [
        ([], "no_intervals"),
        ([(0.0, 1.0)], "flat"),  # always busy
        # a 0.6 ms cycle (0.3 on, 0.3 off) under 1 ms bins: below Nyquist, whatever the bins alias it into
        ([(k * 0.0006, k * 0.0006 + 0.0003) for k in range(1666)], "below_nyquist"),
        # busy for the first half, idle for the second: one step, not a cycle
        ([(0.0, 0.5)], "no_cycle"),
    ],
)
def test_no_period_says_why(intervals: list[tuple[float, float]], reason: str) -> None:
    s = busy_stats(intervals, 0.0, 1.0)
    assert (s.period_seconds, s.period_reason) == (None, reason)
    assert reason in PERIOD_REASONS


def test_a_window_shorter_than_eight_bins_is_too_short() -> None:
    assert period_with_reason([0.0, 1.0] * 3, 0.001) == (None, "too_short")


def test_random_busy_runs_have_no_cycle() -> None:
    rng = random.Random(7)
    t, runs = 0.0, []
    while t < 2.0:
        length = rng.expovariate(1 / 0.004)
        runs.append((t, t + length))
        t += length + rng.expovariate(1 / 0.004)
    assert busy_stats(runs, 0.0, 2.0).period_reason == "no_cycle"


def test_merge_and_binning() -> None:
    # Overlaps and a gap under a tenth of a 1 ms bin join; clipped to the window.
    runs = merge([(0.5, 0.8), (-1.0, 0.2), (0.1, 0.3), (0.80005, 0.9), (1.5, 2.0)], 0.0, 1.0, 0.0001)
    assert runs == [(0.0, 0.3), (0.5, 0.9)]
    assert binned(runs, 0.0, 1.0, 0.25) == pytest.approx([1.0, 0.2, 1.0, 0.6])


def test_without_numpy_the_python_paths_give_the_same_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    values = [1.0 if (i % 29) < 14 else 0.0 for i in range(400)]
    with_numpy = period_with_reason(values, 0.001)
    timeline = on_off(0.029, 0.5, 0.6, 0.001, 3)
    runs = merge(timeline, 0.0, 0.6, 0.0001)
    bins_numpy = binned(runs, 0.0, 0.6, 0.001)
    real = builtins.__import__

    def no_numpy(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "numpy":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_numpy)
    assert period_with_reason(values, 0.001) == with_numpy == (pytest.approx(0.029), None)
    assert binned(runs, 0.0, 0.6, 0.001) == pytest.approx(bins_numpy, abs=1e-9)


def test_swing_period_of_a_square_wave_and_its_limits() -> None:
    # 10 ms samples, busy 3 samples of every 8: period 80 ms.
    wave = [100.0 if i % 8 < 3 else 20.0 for i in range(400)]
    assert swing_period(wave, 0.01) == pytest.approx(0.08)
    assert swing_period([50.0] * 400, 0.01) is None  # flat: no swing
    # Alternating samples are a period of exactly two intervals: the shortest a series can show (Nyquist).
    assert swing_period([0.0, 100.0] * 100, 0.01) == pytest.approx(0.02)
    # A 29 ms cycle (0 / 100 %) seen through 167 ms averages (NVML's ~1/6 s): the swing is averaged away to
    # 4 points, and what periodicity is left is an alias of about 690 ms (6/167 - 1/29 per ms), never 29 ms.
    # No series gives a period under two of its intervals.
    fine = [100.0 if (i % 29) < 10 else 0.0 for i in range(29 * 600)]  # 1 ms samples
    coarse = [sum(fine[k : k + 167]) / 167 for k in range(0, len(fine) - 167, 167)]
    assert max(coarse) - min(coarse) < 5.0
    alias = swing_period(coarse, 0.167)
    assert alias is not None and 0.5 < alias < 1.0


def test_util_figures_are_exact_nearest_rank_percentiles() -> None:
    samples = [(i * 0.01, float(v)) for i, v in enumerate(range(0, 101))]  # 0 ... 100 %
    got = util_figures(samples, 0.01)
    assert got["util.mean_pct"] == 50.0
    assert (got["util.p5_pct"], got["util.p95_pct"], got["util.peak_to_trough_pct"]) == (5.0, 95.0, 90.0)
    assert got["util.interval_ms"] == 10.0 and got["util.samples"] == 101.0
    assert set(util_figures([], None).values()) == {None}
