"""The U-curve fit on synthetic data with known parameters: recovered exactly without noise, within a stated
bound with noise; monotone data has no interior optimum; too few points or bad x are refused."""

from __future__ import annotations

import math
import random

import pytest

from loadlens.experiment.analysis.fits import FitError, fit_u_curve

XS = [10.0, 15.0, 25.0, 40.0, 60.0, 80.0, 100.0, 130.0, 160.0, 200.0]


def u(x: float) -> float:
    return float(8.0 + 400.0 * x**-0.8 + 0.002 * x**1.5)


def test_recovers_known_parameters_and_optimum() -> None:
    fit = fit_u_curve(XS, [u(x) for x in XS])
    assert fit.a == pytest.approx(8.0, rel=1e-4)
    assert fit.b == pytest.approx(400.0, rel=1e-4)
    assert fit.p == pytest.approx(0.8, rel=1e-4)
    assert fit.c == pytest.approx(0.002, rel=1e-3)
    assert fit.q == pytest.approx(1.5, rel=1e-4)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)
    # d/dx = 0 at x* = (p·b / (q·c))^(1/(p+q))
    expected = (0.8 * 400.0 / (1.5 * 0.002)) ** (1 / 2.3)
    assert fit.optimum_x == pytest.approx(expected, rel=1e-3)
    assert fit.optimum_y == pytest.approx(u(expected), rel=1e-6)
    assert fit.interior is True
    ends = min(u(10.0), u(200.0))
    assert fit.dip_ratio == pytest.approx((ends - u(expected)) / u(expected), rel=1e-4)
    assert fit.predict(50.0) == pytest.approx(u(50.0), rel=1e-6)
    curve = fit.curve(5)
    assert [round(x, 6) for x, _ in curve] == [10.0, round(10 * 20**0.25, 6), round(10 * 20**0.5, 6),
                                               round(10 * 20**0.75, 6), 200.0]  # fmt: skip


def test_the_guide_fit_is_recovered() -> None:
    """Guide 4.1's own model, P99 = 8.2 + 1240·w^-0.67 + 0.0013·w^1.82, sampled over its 10-200 µs."""
    guide = [8.2 + 1240 * x**-0.67 + 0.0013 * x**1.82 for x in XS]
    fit = fit_u_curve(XS, guide)
    assert (round(fit.a, 2), round(fit.b, 0), round(fit.p, 3), round(fit.q, 3)) == (8.2, 1240.0, 0.67, 1.82)
    assert fit.r2 > 0.999999


def test_noisy_u_curve_keeps_r2_above_bound_and_optimum_inside() -> None:
    rng = random.Random(7)
    ys = [u(x) * (1 + rng.gauss(0, 0.02)) for x in XS]
    fit = fit_u_curve(XS, ys)
    assert fit.r2 > 0.95
    assert fit.interior
    assert 100 < fit.optimum_x < 200  # the true optimum is 151.5


def test_monotone_rise_has_no_interior_optimum() -> None:
    """What the sim's window does (it only adds a wait): the minimum is the smallest window."""
    xs = [1e3, 3e3, 1e4, 3e4, 1e5, 3e5, 1e6]
    fit = fit_u_curve(xs, [20.0 + 1e-4 * x for x in xs])
    assert fit.r2 > 0.9999
    assert fit.interior is False and fit.dip_ratio == 0.0
    assert fit.optimum_x == pytest.approx(1e3, rel=1e-2)


@pytest.mark.parametrize(
    ("xs", "ys", "message"),
    [
        ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], "needs at least 6 distinct x values (5 parameters + 1), got 5"),
        ([0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6], "x must be > 0 (x^-p), got 0"),
        ([1, 2, 3, 4, 5, 6], [1, 2, math.nan, 4, 5, 6], "every x and y must be finite"),
        ([1, 2, 3, 4, 5, 6], [1, 2], "6 x values but 2 y values"),
    ],
)
def test_bad_input_is_refused(xs: list[float], ys: list[float], message: str) -> None:
    with pytest.raises(FitError) as err:
        fit_u_curve(xs, ys)
    assert str(err.value) == message


def test_a_dip_within_the_fits_scatter_is_told_from_a_real_one() -> None:
    # A monotone rise whose first point scattered up (a 5 ms TTFT measured as 6.0 ms): the fit bends to it,
    # 18 % below its lower end, but by less than twice its RMS residual; the guide's U dips by far more.
    noisy = fit_u_curve([1000, 10000, 30000, 100000, 300000, 1000000], [6.0, 4.8, 8.7, 14.7, 36.5, 93.1])
    assert noisy.interior and noisy.dip_ratio > 0.05
    assert noisy.points == 6 and noisy.dip == pytest.approx(0.928, abs=0.01)
    assert noisy.dip < 2 * noisy.rmse == pytest.approx(1.404, abs=0.01)

    def u(w: float) -> float:
        return float(8.2 + 1240 * w**-0.67 + 0.0013 * w**1.82)

    xs = [10, 20, 40, 60, 80, 120, 200]
    clean = fit_u_curve(xs, [u(x) for x in xs])
    assert clean.interior and clean.dip > 1.0 and clean.rmse < 1e-4
