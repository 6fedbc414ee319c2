"""The ``lora_rank`` analysis (guide 2.1): per-token latency of the base model and of one adapter per rank, the
increment each adapter adds over the base, and the guide's claim that the increment grows sub-linearly with
rank, tested by a fit instead of asserted.

The trials: one without adapters (the base) and one per adapter, each loading exactly one adapter of the
experiment's ``adapters`` (its rank read from the result's adapter records). Per trial: adapter size (the guide's
formula and the file's bytes), the latency figure ``y`` (default ``mean_tpot_ms``) with p50/p99 and its standard
error, mean token ITL with p50/p99, and the increments over the base (absolute and relative).

The fit: ``increment = a·r^b`` by least squares on (ln r, ln increment). Its uncertainty on b is twice the
larger of two standard errors: the measurement's (each point's standard error in log space, carried through
the least-squares slope) and the residuals' (the scatter about the line; one degree of freedom at three
ranks). Finding ``sub_linear``: passes when b + uncertainty < 1, fails when b >= 1, else not judged; not judged
either when a point is unusable (an increment <= 0 or within twice its standard error) or there are fewer than
:data:`MIN_POINTS` ranks. docs/experiments.md (*lora-rank*) defines every column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from loadlens.contracts.experiment_result import (
    AdapterRecord,
    Column,
    ExperimentResult,
    Finding,
    Fit,
    Plot,
    Scalar,
    Table,
    Trial,
)
from loadlens.contracts.slo import SLOConfig
from loadlens.experiment.models import Analysis

MIN_POINTS = 3
"""Two parameters: a third rank leaves one degree of freedom for the residuals."""
NOISE_SIGMAS = 2.0
"""An increment within this many of its standard errors of zero is noise; b's uncertainty is this many standard
errors."""
FORMULA = "a*x^b"
MIB = 1024 * 1024
LATENCY = ["mean_tpot_ms", "mean_itl_ms"]
"""Shown for every trial with their increments, beside the fitted figure ``y``."""
PERCENTILES = ["p50_tpot_ms", "p99_tpot_ms", "p50_itl_ms", "p99_itl_ms"]
LABELS = {
    "mean_tpot_ms": "mean TPOT",
    "median_tpot_ms": "median TPOT",
    "mean_itl_ms": "mean token ITL",
    "median_itl_ms": "median token ITL",
    "p50_tpot_ms": "TPOT p50",
    "p99_tpot_ms": "TPOT p99",
    "p50_itl_ms": "ITL p50",
    "p99_itl_ms": "ITL p99",
}
P90_Z = 1.2816
"""The 90th percentile of the standard normal distribution."""
MEDIAN_SE = math.sqrt(math.pi / 2)
"""The standard error of a sample median is about √(π/2) x that of the mean (normal samples)."""


class PowerFitError(ValueError):
    """The points cannot be fitted (too few, non-positive x or y)."""


@dataclass(frozen=True)
class PowerFit:
    """``y = a·x^b`` fitted on (ln x, ln y)."""

    a: float
    b: float
    b_se_measured: float
    """b's standard error from the points' own standard errors (0 when none was given)."""
    b_se_residual: float | None
    """b's standard error from the residuals about the line (None with two points: no degree of freedom)."""
    r2: float
    """R² of the fit in log space."""
    points: int
    x_min: float
    x_max: float

    @property
    def b_err(self) -> float:
        """The uncertainty the finding uses: NOISE_SIGMAS x the larger standard error."""
        return NOISE_SIGMAS * max(self.b_se_measured, self.b_se_residual or 0.0)

    def predict(self, x: float) -> float:
        return float(self.a * x**self.b)

    def curve(self, n: int = 60) -> list[tuple[float, float]]:
        ratio = self.x_max / self.x_min
        xs = [self.x_min * ratio ** (i / (n - 1)) for i in range(n)]
        return [(x, self.predict(x)) for x in xs]


def fit_power_law(xs: Sequence[float], ys: Sequence[float], y_se: Sequence[float] | None = None) -> PowerFit:
    """Least squares of ln y = ln a + b·ln x; ``y_se`` (the standard error of each y) gives b's measured
    standard error: Σ (u_i − ū)² (σ_i / y_i)² / Sxx², u = ln x."""
    if len(xs) != len(ys) or (y_se is not None and len(y_se) != len(ys)):
        raise PowerFitError("x, y and their standard errors must have one value per point")
    if len(set(xs)) < 2:
        raise PowerFitError(f"needs at least 2 distinct x values, got {len(set(xs))}")
    if any(not math.isfinite(v) or v <= 0 for v in (*xs, *ys)):
        raise PowerFitError("every x and y must be finite and > 0 (a power law in log space)")
    us, vs = [math.log(x) for x in xs], [math.log(y) for y in ys]
    n = len(us)
    u_mean, v_mean = sum(us) / n, sum(vs) / n
    sxx = sum((u - u_mean) ** 2 for u in us)
    b = sum((u - u_mean) * (v - v_mean) for u, v in zip(us, vs, strict=True)) / sxx
    ln_a = v_mean - b * u_mean
    sse = sum((v - ln_a - b * u) ** 2 for u, v in zip(us, vs, strict=True))
    sst = sum((v - v_mean) ** 2 for v in vs)
    r2 = 1.0 - sse / sst if sst > 0 else 1.0
    measured = 0.0
    if y_se is not None:
        var = sum((u - u_mean) ** 2 * (se / y) ** 2 for u, y, se in zip(us, ys, y_se, strict=True)) / sxx**2
        measured = math.sqrt(var)
    residual = math.sqrt(sse / (n - 2) / sxx) if n > 2 else None
    return PowerFit(math.exp(ln_a), b, measured, residual, r2, n, min(xs), max(xs))


def _stat(trial: Trial, key: str) -> float | None:
    stat = trial.figures.get(key)
    return None if stat is None else stat.mean


def spread(figures: dict[str, float | None], name: str, *, robust: bool) -> float | None:
    """The samples' standard deviation (``std_X_ms``); ``robust``: (p90 − p50) / 1.2816, the standard
    deviation a normal distribution with those percentiles has, which the top tenth of the samples (a stalled
    host's long gaps) does not move; the plain one when the percentiles are missing."""
    p50, p90 = figures.get(f"p50_{name}_ms"), figures.get(f"p90_{name}_ms")
    if robust and p50 is not None and p90 is not None and p90 > p50:
        return (p90 - p50) / P90_Z
    return figures.get(f"std_{name}_ms")


def standard_error(trial: Trial, key: str) -> float | None:
    """The standard error of a trial's ``key`` (a mean or median over its requests' or tokens' samples, and
    over its repeats): the larger of the within-run one (``std_X`` / √``X_samples`` of each run for
    ``mean_X_ms``; √(π/2) x the robust spread / √``X_samples`` for ``median_X_ms`` and ``p50_X_ms``; combined
    over the repeats) and the between-repeat one (the repeats' standard deviation / √repeats)."""
    runs = [r for r in trial.runs if r.error is None]
    within: float | None = None
    prefix = next((p for p in ("mean_", "median_", "p50_") if key.startswith(p)), None)
    if prefix is not None and key.endswith("_ms") and runs:
        name = key[len(prefix) : -len("_ms")]
        factor = 1.0 if prefix == "mean_" else MEDIAN_SE
        ses: list[float] = []
        for r in runs:
            std, count = spread(r.figures, name, robust=prefix != "mean_"), r.figures.get(f"{name}_samples")
            if std is None or not count:
                ses = []
                break
            ses.append(factor * std / math.sqrt(count))
        if ses:
            within = math.sqrt(sum(s * s for s in ses)) / len(ses)
    stat = trial.figures.get(key)
    between = stat.std / math.sqrt(stat.n) if stat is not None and stat.std is not None and stat.n >= 2 else None
    known = [s for s in (within, between) if s is not None]
    return max(known) if known else None


def _ratio(delta: float | None, base: float | None) -> float | None:
    return None if delta is None or not base else delta / base


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def lora_rank_analysis(spec: Analysis, result: ExperimentResult, slos: SLOConfig) -> None:
    y = spec.y
    shown = list(dict.fromkeys([y, *LATENCY]))
    done = [t for t in result.trials if t.status == "done"]
    records: dict[str, AdapterRecord] = {a.name: a for a in result.adapters}
    base = next((t for t in done if not t.adapters), None)
    ranked = [(records[t.adapters[0]], t) for t in done if len(t.adapters) == 1 and t.adapters[0] in records]
    ranked.sort(key=lambda pair: pair[0].rank)
    base_se = standard_error(base, y) if base is not None else None
    rows: list[dict[str, Scalar]] = []
    if base is not None:
        rows.append(_row(base, None, y, shown, None))
    points: list[tuple[float, float, float]] = []
    unusable: list[str] = []
    for record, t in ranked:
        row = _row(t, record, y, shown, base)
        rows.append(row)
        inc = row[f"increment_{y}"]
        se_t = standard_error(t, y)
        inc_se = math.hypot(se_t, base_se) if se_t is not None and base_se is not None else None
        row[f"increment_{y}_se"] = inc_se
        if not isinstance(inc, float) or inc <= 0 or inc_se is None or inc <= NOISE_SIGMAS * inc_se:
            why = "no figure" if not isinstance(inc, float) else f"{inc:+.4g} ms" + (
                f" ± {inc_se:.2g}" if inc_se is not None else "")  # fmt: skip
            unusable.append(f"r={record.rank} ({why})")
        else:
            points.append((float(record.rank), inc, inc_se))
    fit = Fit(name="increment", formula=FORMULA, x="rank", y=f"increment_{y}", points=len(points))
    power: PowerFit | None = None
    if base is None:
        fit.error = "no done trial without adapters (the base)"
    elif unusable:
        fit.error = f"increment <= 0 or within {NOISE_SIGMAS:g} standard errors of it at " + ", ".join(unusable)
    elif len(points) < MIN_POINTS:
        fit.error = f"needs at least {MIN_POINTS} ranks with an increment, got {len(points)}"
    else:
        try:
            power = fit_power_law([p[0] for p in points], [p[1] for p in points], [p[2] for p in points])
        except PowerFitError as err:
            fit.error = str(err)
    if power is not None:
        fit.params = {"a": power.a, "b": power.b}
        fit.params_err = {"b": power.b_err}
        fit.r2, fit.x_min, fit.x_max, fit.curve = power.r2, power.x_min, power.x_max, power.curve()
        for row in rows:
            if isinstance(row["rank"], int) and row["rank"] > 0:
                row["fit"] = power.predict(float(row["rank"]))
    result.tables = [
        Table(name="ranks", title="guide 2.1: per-token latency and its increment per LoRA rank (means over repeats)",
              columns=_columns(y, shown), rows=rows),
        Table(name="detail", title="per trial: percentiles, standard errors, the other figures' increments",
              columns=_detail_columns(y, shown), rows=rows),
    ]  # fmt: skip
    if power is not None:
        result.tables.append(_fit_table(power, y))
    result.fits = [fit]
    result.plots = [
        Plot(name="latency", title="per-token latency vs rank (rank 0: the base model)", x="rank", x_label="rank r",
             y=shown, y_label="ms"),
        Plot(name="increment", title=f"increment over the base vs rank, fit {FORMULA}", x="rank", x_label="rank r",
             y=[f"increment_{y}"], y_label="ms", fit="increment"),
    ]  # fmt: skip
    result.findings = [sub_linear_finding(power, fit.error)]


def sub_linear_finding(power: PowerFit | None, error: str | None) -> Finding:
    name = "sub_linear"
    if power is None:
        return Finding(name=name, passed=None, detail=f"not judged: {error}")
    b, err = power.b, power.b_err
    what = f"increment = {power.a:.4g}·r^{b:.3f} (b ± {err:.3f}, R² {power.r2:.3f} in log space)"
    if b >= 1:
        return Finding(name=name, passed=False, detail=f"{what}: b >= 1, not sub-linear")
    if b + err < 1:
        return Finding(name=name, passed=True, detail=f"{what}: b below 1 by more than its uncertainty")
    return Finding(name=name, passed=None, detail=f"not judged: {what}: b is within its uncertainty of 1")


def _row(t: Trial, record: AdapterRecord | None, y: str, shown: list[str], base: Trial | None) -> dict[str, Scalar]:
    row: dict[str, Scalar] = {
        "rank": 0 if record is None else record.rank,
        "trial": t.name,
        "adapter": None if record is None else record.name,
        "formula_mib": None if record is None else record.formula_bytes / MIB,
        "file_mib": None if record is None else record.file_bytes / MIB,
        f"{y}_se": standard_error(t, y),
        **{k: _stat(t, k) for k in PERCENTILES},
        f"increment_{y}_se": None,
        "fit": None,
    }
    for key in shown:
        value = _stat(t, key)
        ref = _stat(base, key) if base is not None else None
        row[key] = value
        row[f"increment_{key}"] = _minus(value, ref) if base is not None else None
        row[f"increment_{key}_pct"] = _ratio(row[f"increment_{key}"], ref)  # type: ignore[arg-type]
    return row


def _columns(y: str, shown: list[str]) -> list[Column]:
    """The guide's table (rank | extra params | mean per-token latency) plus the increment."""
    return [
        Column(key="rank", label="rank r"),
        Column(key="formula_mib", label="extra params (formula)", unit="MiB"),
        Column(key="file_mib", label="adapter file", unit="MiB"),
        *(Column(key=k, label=LABELS.get(k, k), unit="ms") for k in shown),
        Column(key=f"increment_{y}", label=f"{LABELS.get(y, y)} increment over the base", unit="ms"),
        Column(key=f"increment_{y}_pct", label="increment / base"),
        Column(key="fit", label=f"fit {FORMULA}", unit="ms"),
    ]


def _detail_columns(y: str, shown: list[str]) -> list[Column]:
    """Per trial: percentiles, standard errors and the other figures' increments."""
    return [
        Column(key="rank", label="rank r"),
        Column(key="trial", label="trial"),
        Column(key="adapter", label="adapter"),
        Column(key=f"{y}_se", label=f"{LABELS.get(y, y)} standard error", unit="ms"),
        *(Column(key=k, label=LABELS.get(k, k), unit="ms") for k in PERCENTILES),
        Column(key=f"increment_{y}_se", label="increment standard error", unit="ms"),
        *(c for k in shown if k != y for c in (
            Column(key=f"increment_{k}", label=f"{LABELS.get(k, k)} increment", unit="ms"),
            Column(key=f"increment_{k}_pct", label=f"{LABELS.get(k, k)} increment / base"),
        )),
    ]  # fmt: skip


def _fit_table(power: PowerFit, y: str) -> Table:
    row: dict[str, Scalar] = {
        "a": power.a,
        "b": power.b,
        "b_err": power.b_err,
        "b_se_measured": power.b_se_measured,
        "b_se_residual": power.b_se_residual,
        "r2": power.r2,
        "points": power.points,
    }
    return Table(name="fit", title=f"increment of {y} = a·r^b (least squares in log space)", columns=[
        Column(key="a", label="a", unit="ms"), Column(key="b", label="b"),
        Column(key="b_err", label=f"b uncertainty ({NOISE_SIGMAS:g} standard errors)"),
        Column(key="b_se_measured", label="b standard error from the points' errors"),
        Column(key="b_se_residual", label="b standard error from the residuals"),
        Column(key="r2", label="R² (log space)"), Column(key="points", label="ranks fitted"),
    ], rows=[row])  # fmt: skip
