"""Significance of a difference of means, in plain Python: Welch's t-test from summary statistics (mean,
standard deviation, count), as a results file holds them. The t distribution's tail comes from the
regularised incomplete beta function, evaluated by its continued fraction (modified Lentz).

Usage::

    test = welch(10.0, 2.0, 30, 11.0, 2.0, 30)
    test.t, test.df, test.p_value        # -1.936..., 58.0, 0.0577...
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TTest:
    t: float
    df: float
    p_value: float
    """Two-sided: the probability of a |t| at least this large if the means were equal."""


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-14:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def welch(mean1: float, std1: float, n1: int, mean2: float, std2: float, n2: int) -> TTest | None:
    """Welch's unequal-variance t-test of mean1 vs mean2; None when either side has fewer than 2 samples
    or both have no spread."""
    if n1 < 2 or n2 < 2:
        return None
    v1, v2 = std1 * std1 / n1, std2 * std2 / n2
    if v1 + v2 == 0:
        return None
    t = (mean1 - mean2) / math.sqrt(v1 + v2)
    df = (v1 + v2) ** 2 / ((v1 * v1 / (n1 - 1) if v1 else 0.0) + (v2 * v2 / (n2 - 1) if v2 else 0.0))
    return TTest(t, df, t_two_sided(t, df))
