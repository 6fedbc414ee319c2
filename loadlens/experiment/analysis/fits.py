"""Curve fits for the experiments, in plain Python (no numpy/scipy in the base install).

The batching-window U-curve of guide 4.1: ``y(w) = a + b·w^-p + c·w^q`` with b, c ≥ 0 and p, q in
(0, :data:`EXP_MAX`]. For fixed exponents the model is linear in (a, b, c), so the fit is a search over
(p, q) (a coarse grid, then a shrinking pattern search) around an exact non-negative least-squares solve of
(a, b, c) (every active set of the two constrained coefficients, smallest residual wins).

Usage::

    fit = fit_u_curve([10, 25, 50, 100, 200], [40.1, 21.0, 15.2, 16.8, 30.3])
    fit.r2, fit.optimum_x, fit.predict(75.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

EXP_MIN = 0.02
EXP_MAX = 4.0
MIN_POINTS = 6
"""Five parameters: six points leave one degree of freedom, so R² says something."""
FORMULA = "a + b*x^-p + c*x^q"


class FitError(ValueError):
    """The data cannot be fitted (too few points, non-positive x, non-finite values)."""


@dataclass(frozen=True)
class UCurveFit:
    a: float
    b: float
    p: float
    c: float
    q: float
    r2: float
    sse: float
    x_min: float
    x_max: float
    optimum_x: float
    optimum_y: float
    points: int = 0  # how many (x, y) points were fitted

    @property
    def rmse(self) -> float:
        """Root-mean-square residual of the fit: the scatter a dip must exceed to be more than noise."""
        return math.sqrt(self.sse / self.points) if self.points else 0.0

    @property
    def dip(self) -> float:
        """How far the fitted minimum lies below the lower of the curve's two ends, in y's unit (0: monotone)."""
        return max(0.0, min(self.predict(self.x_min), self.predict(self.x_max)) - self.optimum_y)

    def predict(self, x: float) -> float:
        return float(self.a + self.b * x**-self.p + self.c * x**self.q)

    @property
    def dip_ratio(self) -> float:
        """How far the fitted minimum lies below the lower of the curve's two ends, relative to the minimum
        (0 for a monotone fit): a dip of a few per cent can be the fit bending to noise."""
        ends = min(self.predict(self.x_min), self.predict(self.x_max))
        return max(0.0, (ends - self.optimum_y) / abs(self.optimum_y)) if self.optimum_y else 0.0

    @property
    def interior(self) -> bool:
        """The fitted minimum lies strictly inside the swept range (not at, or within 1 % of, an end)."""
        span = math.log(self.x_max) - math.log(self.x_min)
        lo = math.log(self.optimum_x) - math.log(self.x_min)
        return self.b > 0 and self.c > 0 and 0.01 * span < lo < 0.99 * span

    def curve(self, n: int = 60) -> list[tuple[float, float]]:
        """``n`` points of the fitted curve, log-spaced over the swept range."""
        ratio = self.x_max / self.x_min
        xs = [self.x_min * ratio ** (i / (n - 1)) for i in range(n)]
        return [(x, self.predict(x)) for x in xs]


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(rhs)
    m = [row[:] + [rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def _lstsq(columns: list[list[float]], ys: Sequence[float]) -> list[float] | None:
    """Least squares on column-normalised normal equations (the columns span many orders of magnitude)."""
    norms = [math.sqrt(sum(v * v for v in col)) or 1.0 for col in columns]
    scaled = [[v / nrm for v in col] for col, nrm in zip(columns, norms, strict=True)]
    k = len(scaled)
    ata = [[sum(u * v for u, v in zip(scaled[i], scaled[j], strict=True)) for j in range(k)] for i in range(k)]
    aty = [sum(u * y for u, y in zip(scaled[i], ys, strict=True)) for i in range(k)]
    sol = _solve(ata, aty)
    return None if sol is None else [s / nrm for s, nrm in zip(sol, norms, strict=True)]


def _coefficients(xs: Sequence[float], ys: Sequence[float], p: float, q: float) -> tuple[float, float, float, float]:
    """The best (a, b, c) with b, c ≥ 0 for exponents (p, q), and its residual sum of squares."""
    one = [1.0] * len(xs)
    down = [x**-p for x in xs]
    up = [x**q for x in xs]
    best = (math.inf, 0.0, 0.0, 0.0)
    for use_b, use_c in ((True, True), (True, False), (False, True), (False, False)):
        cols = [one] + ([down] if use_b else []) + ([up] if use_c else [])
        sol = _lstsq(cols, ys)
        if sol is None:
            continue
        a = sol[0]
        b = sol[1] if use_b else 0.0
        c = sol[-1] if use_c else 0.0
        if b < 0 or c < 0:
            continue
        sse = sum((a + b * d + c * u - y) ** 2 for d, u, y in zip(down, up, ys, strict=True))
        if sse < best[0]:
            best = (sse, a, b, c)
    return best[1], best[2], best[3], best[0]


def fit_u_curve(xs: Sequence[float], ys: Sequence[float]) -> UCurveFit:
    """Fit ``a + b·x^-p + c·x^q`` to the points; see the module docstring."""
    if len(xs) != len(ys):
        raise FitError(f"{len(xs)} x values but {len(ys)} y values")
    if len(set(xs)) < MIN_POINTS:
        raise FitError(f"needs at least {MIN_POINTS} distinct x values (5 parameters + 1), got {len(set(xs))}")
    if any(not math.isfinite(v) for v in (*xs, *ys)):
        raise FitError("every x and y must be finite")
    if min(xs) <= 0:
        raise FitError(f"x must be > 0 (x^-p), got {min(xs)}")

    def sse(p: float, q: float) -> float:
        return _coefficients(xs, ys, p, q)[3]

    grid = [EXP_MIN + (EXP_MAX - EXP_MIN) * i / 39 for i in range(40)]
    p, q = min(((gp, gq) for gp in grid for gq in grid), key=lambda pq: sse(*pq))
    step = (EXP_MAX - EXP_MIN) / 39
    best = sse(p, q)
    while step > 1e-7:
        moved = False
        for dp, dq in ((step, 0.0), (-step, 0.0), (0.0, step), (0.0, -step), (step, step), (-step, -step)):
            cp, cq = min(max(p + dp, EXP_MIN), EXP_MAX), min(max(q + dq, EXP_MIN), EXP_MAX)
            value = sse(cp, cq)
            if value < best:
                p, q, best, moved = cp, cq, value, True
                break
        if not moved:
            step /= 2
    a, b, c, residual = _coefficients(xs, ys, p, q)
    mean = sum(ys) / len(ys)
    total = sum((y - mean) ** 2 for y in ys)
    r2 = 1.0 - residual / total if total > 0 else 1.0
    lo, hi = min(xs), max(xs)
    if b > 0 and c > 0:
        x_opt = min(max((p * b / (q * c)) ** (1.0 / (p + q)), lo), hi)
    else:
        x_opt = hi if c == 0 else lo  # monotone: decreasing without the rising term, else rising
    fit = UCurveFit(a, b, p, c, q, r2, residual, lo, hi, x_opt, 0.0)
    return UCurveFit(a, b, p, c, q, r2, residual, lo, hi, x_opt, fit.predict(x_opt), len(xs))
