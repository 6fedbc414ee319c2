from __future__ import annotations

import math

import pytest

from exporters.gpu.stats import (
    StepDetector,
    median_interval,
    memory_window,
    percentile,
    swing_period,
    util_stats,
)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0], 0.5, 1.0),
        ([0.0, 10.0], 0.0, 0.0),
        ([0.0, 10.0], 1.0, 10.0),
        ([0.0, 10.0], 0.25, 2.5),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0.5, 3.0),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0.95, 4.8),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0.05, 1.2),
    ],
)
def test_percentile_interpolates_like_numpy(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("values", "q"), [([], 0.5), ([1.0], 1.5), ([1.0], -0.1)])
def test_percentile_rejects_bad_input(values: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        percentile(values, q)


@pytest.mark.parametrize(
    ("times", "expected"),
    [([], None), ([1.0], None), ([0.0, 0.1, 0.2, 0.3], 0.1), ([0.0, 0.1, 0.2, 1.2], 0.1), ([0.0, 1.0, 3.0], 1.5)],
)
def test_median_interval(times: list[float], expected: float | None) -> None:
    got = median_interval(times)
    assert got == (None if expected is None else pytest.approx(expected))


def square(n: int, dt: float, low: float, high: float, half: int) -> list[tuple[float, float]]:
    return [(i * dt, high if (i // half) % 2 == 0 else low) for i in range(n)]


def test_guide_one_task_pattern() -> None:
    # Guide 2.2, one task: mean 68 %, peak-to-trough 12 points, swing period 84 ms. A square wave sampled
    # every 6 ms with 7 samples high / 7 low has exactly that period.
    s = util_stats(square(140, 0.006, 0.62, 0.74, 7))
    assert s is not None
    assert s.samples == 140
    assert s.mean == pytest.approx(0.68)
    assert (s.min, s.max, s.p5, s.p95) == (0.62, 0.74, 0.62, 0.74)
    assert s.peak_to_trough == pytest.approx(0.12)
    assert s.stddev == pytest.approx(0.06)
    assert s.swing_period == pytest.approx(0.084)
    assert s.sample_interval == pytest.approx(0.006)


def test_guide_three_task_pattern_period_below_nyquist_is_not_invented() -> None:
    # Three tasks swing every 29 ms; sampled at 1/6 s (a real H100's native rate) the period cannot be seen.
    # Sample a 29 ms square wave at 1 ms, then at 100 ms: only the first recovers it.
    fine = [(i * 0.001, 0.925 if (i % 29) < 14.5 else 0.495) for i in range(2900)]
    s = util_stats(fine)
    assert s is not None
    assert s.swing_period == pytest.approx(0.029, rel=0.01)
    assert s.peak_to_trough == pytest.approx(0.43)
    coarse = fine[::100]
    c = util_stats(coarse)
    assert c is not None
    assert c.sample_interval == pytest.approx(0.1)
    # Aliasing: whatever period comes out is at least two sample intervals - the Nyquist limit.
    assert c.swing_period is None or c.swing_period >= 2 * 0.1


def test_flat_utilisation_has_no_period() -> None:
    s = util_stats([(i * 0.1, 0.5) for i in range(50)])
    assert s is not None
    assert s.stddev == 0.0
    assert s.peak_to_trough == 0.0
    assert s.swing_period is None


def test_noise_around_the_mean_is_not_a_swing() -> None:
    # Alternating +-0.1 points around a flat 50 % stays inside the hysteresis band of a big outlier's stddev.
    samples = [(i * 0.1, 0.5 + (0.001 if i % 2 else -0.001)) for i in range(100)] + [(10.0, 1.0)]
    s = util_stats(samples)
    assert s is not None
    assert s.swing_period is None


@pytest.mark.parametrize("samples", [[], [(0.0, 0.5)]])
def test_util_stats_needs_two_samples(samples: list[tuple[float, float]]) -> None:
    assert util_stats(samples) is None


def test_swing_period_needs_two_upward_crossings() -> None:
    assert swing_period([(0.0, 0.0), (0.1, 1.0), (0.2, 1.0), (0.3, 1.0)], 0.75, 0.43) is None
    assert swing_period([(0.0, 0.0), (0.1, 1.0), (0.2, 0.0), (0.3, 1.0)], 0.5, 0.5) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        ([100, 100, 100], (100, 100, 0.0)),
        ([100, 115, 100, 85], (85, 115, 30 / 100)),
        ([0, 0], (0, 0, None)),
    ],
)
def test_memory_window(used: list[int], expected: tuple[int, int, float | None]) -> None:
    mw = memory_window(used)
    assert mw is not None
    assert (mw.min_bytes, mw.max_bytes) == expected[:2]
    assert mw.fluctuation == (None if expected[2] is None else pytest.approx(expected[2]))


def test_memory_window_empty() -> None:
    assert memory_window([]) is None


@pytest.mark.parametrize(
    ("readings", "threshold", "steps"),
    [
        ([10, 10, 10], 5, []),
        ([10, 20, 20], 5, [10]),  # one-tick rise
        ([10, 13, 16, 19, 19], 5, [9]),  # a rise over three ticks is one step
        ([10, 12, 12, 14, 14], 5, []),  # small rises are not steps
        ([10, 20, 20, 30, 30, 25, 35, 35], 5, [10, 10, 10]),  # three adapters, one unload
        ([10, 20], 5, []),  # a run still rising has not ended
    ],
)
def test_step_detector(readings: list[int], threshold: int, steps: list[int]) -> None:
    d = StepDetector(threshold)
    got = [s for s in (d.update(v) for v in readings) if s is not None]
    assert got == steps


def test_stats_are_finite_for_extremes() -> None:
    s = util_stats([(0.0, 0.0), (0.1, 1.0)])
    assert s is not None
    assert all(math.isfinite(v) for v in (s.mean, s.stddev, s.p5, s.p95))
