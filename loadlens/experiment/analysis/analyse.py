"""The analysis step: from the trials' figures (means over repeats) to the guide's table shapes, fits and
findings. One function per ``analysis.kind``; docs/experiments.md defines every column.

Usage::

    result = analyse(spec.analysis, slos)(result)   # fills result.tables, .fits, .findings, .plots
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from loadlens.contracts.experiment_result import Column, ExperimentResult, Finding, Fit, Plot, Scalar, Table, Trial
from loadlens.contracts.slo import SLOConfig
from loadlens.experiment.analysis.fits import FORMULA, FitError, UCurveFit, fit_u_curve
from loadlens.experiment.analysis.hot_swap import hot_swap_analysis
from loadlens.experiment.analysis.lora_rank import lora_rank_analysis
from loadlens.experiment.analysis.multi_lora import multi_lora_analysis
from loadlens.experiment.models import Analysis, Search

PERCENTILE_KEY = {0.5: "p50", 0.9: "p90", 0.95: "p95", 0.99: "p99", 0.999: "p99.9"}
BENCHMARK_COLUMNS = ["mean_ttft_ms", "output_throughput", "server.peak_vram_gib", "p99_e2el_ms"]
LABELS: dict[str, tuple[str, str]] = {
    "mean_ttft_ms": ("mean TTFT", "ms"),
    "mean_e2el_ms": ("mean E2E", "ms"),
    "p99_ttft_ms": ("TTFT p99", "ms"),
    "p99_e2el_ms": ("E2E p99", "ms"),
    "p95_e2el_ms": ("E2E p95", "ms"),
    "median_e2el_ms": ("median E2E", "ms"),
    "median_ttft_ms": ("median TTFT", "ms"),
    "output_throughput": ("output throughput", "tok/s"),
    "request_throughput": ("throughput", "req/s"),
    "server.peak_vram_gib": ("VRAM peak", "GiB"),
    "sampled.mean_running": ("mean running", "requests"),
    "sampled.peak_running": ("peak running", "requests"),
    "sampled.mean_waiting": ("mean waiting", "requests"),
    "sampled.mean_kv_cache_usage": ("mean KV cache usage", ""),
    "sampled.peak_kv_cache_usage": ("peak KV cache usage", ""),
    "jain_fairness_index": ("Jain index", ""),
    "error_ratio": ("error ratio", ""),
}


def _mean(trial: Trial, key: str) -> float | None:
    stat = trial.figures.get(key)
    return None if stat is None else stat.mean


def _std(trial: Trial, key: str) -> float | None:
    stat = trial.figures.get(key)
    return None if stat is None else stat.std


def _col(key: str) -> Column:
    label, unit = LABELS.get(key, (key, ""))
    return Column(key=key, label=label, unit=unit)


def _done(result: ExperimentResult) -> list[Trial]:
    return [t for t in result.trials if t.status == "done"]


def table_analysis(spec: Analysis, result: ExperimentResult, slos: SLOConfig) -> None:
    keys = spec.columns or BENCHMARK_COLUMNS
    rows = [{"trial": t.name, **{k: _mean(t, k) for k in keys}} for t in _done(result)]
    result.tables = [
        Table(
            name="summary",
            title="per trial (means over repeats)",
            columns=[Column(key="trial", label="config"), *(_col(k) for k in keys)],
            rows=rows,
        )  # fmt: skip
    ]


def u_curve_analysis(spec: Analysis, result: ExperimentResult, slos: SLOConfig) -> None:
    assert spec.x is not None
    trials = [t for t in _done(result) if isinstance(t.params.get(spec.x), int | float)]
    points = [(float(t.params[spec.x]), _mean(t, spec.y)) for t in trials]  # type: ignore[arg-type]
    xs = [x for x, y in points if y is not None]
    ys = [y for _, y in points if y is not None]
    fit = Fit(name="u_curve", formula=FORMULA, x=spec.x, y=spec.y, points=len(xs))
    try:
        f = fit_u_curve(xs, ys)
    except FitError as err:
        fit.error = str(err)
        f = None
    if f is not None:
        fit.params = {"a": f.a, "b": f.b, "p": f.p, "c": f.c, "q": f.q}
        fit.r2, fit.x_min, fit.x_max = f.r2, f.x_min, f.x_max
        fit.optimum_x, fit.optimum_y, fit.interior = f.optimum_x, f.optimum_y, f.interior
        fit.dip_ratio = f.dip_ratio
        fit.curve = f.curve()
    rows: list[dict[str, Scalar]] = []
    for t in trials:
        x = float(t.params[spec.x])  # type: ignore[arg-type]
        rows.append({
            spec.x: x,
            spec.y: _mean(t, spec.y),
            f"{spec.y}_std": _std(t, spec.y),
            "fit": f.predict(x) if f is not None else None,
            spec.throughput: _mean(t, spec.throughput),
        })  # fmt: skip
    ylabel, yunit = LABELS.get(spec.y, (spec.y, ""))
    result.tables = [
        Table(
            name="sweep",
            title=f"{ylabel} and throughput per {spec.x}",
            columns=[
                Column(key=spec.x, label=spec.x),
                _col(spec.y),
                Column(key=f"{spec.y}_std", label=f"{ylabel} std over repeats", unit=yunit),
                Column(key="fit", label=f"fit {FORMULA}", unit=yunit),
                _col(spec.throughput),
            ],
            rows=rows,
        )
    ]
    result.fits = [fit]
    result.plots = [
        Plot(
            name="u_curve",
            title=f"{ylabel} vs {spec.x}",
            x=spec.x,
            x_label=spec.x,
            y=[spec.y],
            y_label=f"{ylabel} ({yunit})",
            fit="u_curve",
            log_x=True,
        ),  # fmt: skip
        Plot(
            name="throughput",
            title=f"throughput vs {spec.x}",
            x=spec.x,
            x_label=spec.x,
            y=[spec.throughput],
            y_label=" ".join(LABELS.get(spec.throughput, (spec.throughput, ""))),
            log_x=True,
        ),  # fmt: skip
    ]
    if f is None:
        result.findings = [Finding(name="fit", passed=None, detail=f"no fit: {fit.error}")]
        return
    result.findings = [
        Finding(name="fit_r2", passed=f.r2 >= spec.min_r2, detail=f"R² = {f.r2:.4f} (bound {spec.min_r2})"),
        _optimum_finding(spec, f),
    ]


def _optimum_finding(spec: Analysis, f: UCurveFit) -> Finding:
    """An interior minimum counts when the fit is good (R² >= min_r2) and dips below the curve's lower end by
    at least min_dip and by more than twice the fit's RMS residual: a fit bending to noise at one end (a
    millisecond-scale TTFT on a busy machine scatters by 10-20 %) is no U."""
    name = "optimum_inside_range"
    where = f"[{f.x_min:g}, {f.x_max:g}]"
    if f.r2 < spec.min_r2:
        return Finding(name=name, passed=None, detail=f"not judged: the fit's R² {f.r2:.3f} is below {spec.min_r2}")
    if f.interior and f.dip_ratio >= spec.min_dip and f.dip > 2 * f.rmse:
        detail = f"fitted minimum {f.optimum_y:.4g} at {spec.x} = {f.optimum_x:.4g} inside {where}, "
        return Finding(name=name, passed=True, detail=detail + f"{f.dip_ratio:.1%} below the lower end")
    if f.interior:
        detail = (f"no U: the fitted minimum at {spec.x} = {f.optimum_x:.4g} is only {f.dip_ratio:.1%} ({f.dip:.4g}) "
                  f"below the curve's lower end (needs {spec.min_dip:.0%} and more than twice the fit's RMS "
                  f"residual, {2 * f.rmse:.4g})")  # fmt: skip
        return Finding(name=name, passed=False, detail=detail)
    best = f"best end {spec.x} = {f.optimum_x:g}: {f.optimum_y:.4g}"
    detail = f"no interior minimum: the fit is monotone over {where} ({best})"
    return Finding(name=name, passed=False, detail=detail)


def slack_ratio(trial: Trial, cls_name: str, slos: SLOConfig) -> float | None:
    """Allowed delay / actual delay of a class: its TTFT threshold over its TTFT at the class objective's
    percentile (p99 for objective 0.99). > 1: within the SLO with room; < 1: late."""
    cls = next((c for c in slos.classes if c.name == cls_name), None)
    if cls is None:
        return None
    observed = _mean(trial, f"{cls_name}.{PERCENTILE_KEY.get(cls.objective_ratio, 'p99')}_ttft_ms")
    return None if not observed else cls.ttft_seconds * 1000.0 / observed


def fairness_analysis(spec: Analysis, result: ExperimentResult, slos: SLOConfig) -> None:
    inter, batch = spec.interactive_class, spec.batch_class
    rows = []
    for t in _done(result):
        s_i, s_b = slack_ratio(t, inter, slos), slack_ratio(t, batch, slos)
        rows.append({
            "policy": str(t.params.get("policy", t.name)),
            f"{inter}.p95_e2el_ms": _mean(t, f"{inter}.p95_e2el_ms"),
            f"{inter}.p95_ttft_ms": _mean(t, f"{inter}.p95_ttft_ms"),
            f"{batch}.request_throughput": _mean(t, f"{batch}.request_throughput"),
            f"{batch}.output_throughput": _mean(t, f"{batch}.output_throughput"),
            "jain_fairness_index": _mean(t, "jain_fairness_index"),
            f"slack.{inter}": s_i,
            f"slack.{batch}": s_b,
            "slack.min": min(s_i, s_b) if s_i is not None and s_b is not None else None,
        })  # fmt: skip
    cols = [
        Column(key="policy", label="policy"),
        Column(key=f"{inter}.p95_e2el_ms", label=f"{inter} P95 E2E", unit="ms"),
        Column(key=f"{inter}.p95_ttft_ms", label=f"{inter} P95 TTFT", unit="ms"),
        Column(key=f"{batch}.request_throughput", label=f"{batch} throughput", unit="req/s"),
        Column(key=f"{batch}.output_throughput", label=f"{batch} output", unit="tok/s"),
        Column(key="jain_fairness_index", label="Jain index"),
        Column(key=f"slack.{inter}", label=f"slack {inter}"),
        Column(key=f"slack.{batch}", label=f"slack {batch}"),
        Column(key="slack.min", label="slack min"),
    ]
    result.tables = [Table(name="fairness", title="FCFS vs priority (means over repeats)", columns=cols, rows=rows)]
    by_policy = {r["policy"]: r for r in rows}
    fcfs, prio = by_policy.get("fcfs"), by_policy.get("priority")
    key = f"{inter}.p95_e2el_ms"
    if fcfs is None or prio is None or fcfs[key] is None or prio[key] is None:
        result.findings = [
            Finding(name="priority_beats_fcfs", passed=None, detail="needs a done fcfs and priority trial")
        ]
        return
    a, b = float(prio[key]), float(fcfs[key])  # type: ignore[arg-type]
    result.findings = [
        Finding(
            name="priority_beats_fcfs",
            passed=a < b,
            detail=f"{inter} P95 E2E {a:.1f} ms under priority vs {b:.1f} ms under fcfs ({(a - b) / b * 100:+.1f} %)",
        )
    ]


def token_budget_analysis(spec: Analysis, result: ExperimentResult, slos: SLOConfig) -> None:
    trials = _done(result)
    rows: list[dict[str, Any]] = []
    for t in trials:
        rows.append({
            "max_num_seqs": t.params.get("max_num_seqs", t.knobs.get("max_num_seqs")),
            "max_num_batched_tokens": t.params.get("max_num_batched_tokens", t.knobs.get("max_num_batched_tokens")),
            "sampled.mean_running": _mean(t, "sampled.mean_running"),
            "sampled.mean_waiting": _mean(t, "sampled.mean_waiting"),
            "output_throughput": _mean(t, "output_throughput"),
            "mean_ttft_ms": _mean(t, "mean_ttft_ms"),
            "p99_ttft_ms": _mean(t, "p99_ttft_ms"),
        })  # fmt: skip
    # The token budget binds where the effective concurrency falls below what max_num_seqs alone gives
    # (the same max_num_seqs at the largest budget) by more than 10 %.
    reference: dict[object, float] = {}
    for r in sorted(rows, key=lambda r: float(r["max_num_batched_tokens"] or 0)):
        if r["sampled.mean_running"] is not None:
            reference[r["max_num_seqs"]] = float(r["sampled.mean_running"])
    for r in rows:
        ref, run = reference.get(r["max_num_seqs"]), r["sampled.mean_running"]
        r["budget_binds"] = None if ref is None or run is None else float(run) < 0.9 * ref
    cols = [
        Column(key="max_num_seqs", label="max_num_seqs"),
        Column(key="max_num_batched_tokens", label="max_num_batched_tokens"),
        *(_col(k) for k in ("sampled.mean_running", "sampled.mean_waiting", "output_throughput", "mean_ttft_ms")),
        _col("p99_ttft_ms"),
        Column(key="budget_binds", label="token budget binds"),
    ]
    result.tables = [Table(name="grid", title="max_num_seqs x max_num_batched_tokens", columns=cols, rows=rows)]
    result.plots = [
        Plot(name="concurrency", title="effective concurrency vs token budget", x="max_num_batched_tokens",
             x_label="max_num_batched_tokens", y=["sampled.mean_running"], y_label="mean running requests", log_x=True),
    ]  # fmt: skip
    bound = [r for r in rows if r["budget_binds"]]
    result.findings = [
        Finding(
            name="token_budget_binds",
            passed=bool(bound),
            detail=(
                "the budget cuts concurrency at "
                + ", ".join(
                    f"max_num_seqs={r['max_num_seqs']}/tokens={r['max_num_batched_tokens']}"
                    f" ({r['sampled.mean_running']:.1f} running)"
                    for r in bound
                )  # fmt: skip
                if bound
                else "no grid point where the budget lowers mean running by more than 10 %"
            ),
        )
    ]


def run_failures(spec: Analysis, trial: Trial) -> list[list[str]]:
    """Per repeat, the failure criteria it met (``figure value > bound``); empty: the repeat passed."""
    n = max((len(stat.values) for stat in trial.figures.values()), default=0)
    out: list[list[str]] = []
    for k in range(n):
        reasons = []
        for key, bound in spec.failure.items():
            stat = trial.figures.get(key)
            value = stat.values[k] if stat is not None and k < len(stat.values) else None
            if value is not None and value > bound:
                reasons.append(f"{key} {value:.4g} > {bound:g}")
        out.append(reasons)
    return out


def wilson(failures: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a failure probability from ``failures`` of ``n``."""
    if n == 0:
        return 0.0, 1.0
    p = failures / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def burst_analysis(spec: Analysis, result: ExperimentResult, slos: SLOConfig) -> None:
    assert spec.x is not None
    rows: list[dict[str, Any]] = []
    for t in _done(result):
        fails = run_failures(spec, t)
        k, n = sum(1 for f in fails if f), len(fails)
        low, high = wilson(k, n)
        criteria = sorted({r.split(" ")[0] for f in fails for r in f})
        rows.append({
            spec.x: t.params.get(spec.x),
            "mean_e2el_ms": _mean(t, "mean_e2el_ms"),
            "p99_e2el_ms": _mean(t, "p99_e2el_ms"),
            "rate_limited_ratio": _mean(t, "rate_limited_ratio"),
            "server_error_ratio": _mean(t, "server_error_ratio"),
            "preemptions_per_request": _mean(t, "preemptions_per_request"),
            "failure_probability": k / n if n else None,
            "failure_low": low,
            "failure_high": high,
            "failed_by": ", ".join(criteria) or None,
        })  # fmt: skip
    x = spec.x
    rows.sort(key=lambda r: float(r[x]))
    cols = [Column(key=spec.x, label=spec.x), _col("mean_e2el_ms"), _col("p99_e2el_ms"),
            Column(key="rate_limited_ratio", label="429 ratio"), Column(key="server_error_ratio", label="5xx ratio"),
            Column(key="preemptions_per_request", label="preemptions per request"),
            Column(key="failure_probability", label="failure probability"),
            Column(key="failure_low", label="95 % low"), Column(key="failure_high", label="95 % high"),
            Column(key="failed_by", label="failed by")]  # fmt: skip
    tables = [Table(name="bursts", title=f"{spec.x} vs latency vs failure probability", columns=cols, rows=rows)]
    # The threshold: the first size failing in at least half its repeats, bracketed by the size before it;
    # the estimate interpolates failure probability 0.5 linearly between the two.
    first = next((i for i, r in enumerate(rows) if (r["failure_probability"] or 0) >= 0.5), None)
    skipped = [t.name for t in result.trials if t.status == "skipped"]
    if first is None:
        largest = rows[-1][x] if rows else "-"
        finding = Finding(name="threshold_found", passed=False, detail=f"no {x} up to {largest} met the criterion")
    elif first == 0:
        detail = f"the smallest {x} ({rows[0][x]}) already fails: the threshold is below the range"
        finding = Finding(name="threshold_found", passed=None, detail=detail)
    else:
        lo, hi = rows[first - 1], rows[first]
        x0, x1 = float(lo[spec.x]), float(hi[spec.x])
        p0, p1 = float(lo["failure_probability"] or 0), float(hi["failure_probability"] or 0)
        estimate = x0 + (0.5 - p0) / (p1 - p0) * (x1 - x0) if p1 > p0 else x1
        tables.append(Table(name="threshold", title="failure threshold", columns=[
            Column(key="estimate", label=f"{spec.x} at failure probability 0.5"),
            Column(key="low", label="last size below 0.5"), Column(key="high", label="first size at or above 0.5"),
        ], rows=[{"estimate": estimate, "low": x0, "high": x1}]))  # fmt: skip
        finding = Finding(
            name="threshold_found",
            passed=True,
            detail=f"threshold {estimate:.4g} ({spec.x} between {x0:g}, failure probability {p0:.2f}, and {x1:g}, "
            f"{p1:.2f}; failed by {hi['failed_by']})"
            + (f"; skipped after it: {', '.join(skipped)}" if skipped else ""),
        )
    result.tables = tables
    result.findings = [finding]
    result.plots = [
        Plot(name="failure", title=f"failure probability vs {spec.x}", x=spec.x, x_label=spec.x,
             y=["failure_probability"], y_label="failure probability", log_x=True),
        Plot(name="latency", title=f"latency vs {spec.x}", x=spec.x, x_label=spec.x,
             y=["mean_e2el_ms", "p99_e2el_ms"], y_label="E2E (ms)", log_x=True),
    ]  # fmt: skip


def search_analysis(spec: Analysis, result: ExperimentResult, slos: SLOConfig, search: Search) -> None:
    from loadlens.experiment.search import level_outcome, oversaturated, repeat_passes

    var = search.var
    rows: list[dict[str, Any]] = []
    for t in _done(result):
        runs = [r for r in t.runs if r.error is None]
        k = sum(repeat_passes(search, r.figures, r.verdict_status) for r in runs)
        low, high = wilson(k, len(runs))
        sat = any(oversaturated(search, r.figures) for r in runs)
        rows.append({
            var: t.params.get(var),
            "passed": f"{k}/{len(runs)}",
            "pass_probability": k / len(runs) if runs else None,
            "pass_low": low,
            "pass_high": high,
            "goodput_ratio": _mean(t, "goodput_ratio"),
            "request_goodput": _mean(t, "request_goodput"),
            "p99_ttft_ms": _mean(t, "p99_ttft_ms"),
            "p99_e2el_ms": _mean(t, "p99_e2el_ms"),
            "error_ratio": _mean(t, "error_ratio"),
            "verdicts": ", ".join(r.verdict_status or "-" for r in runs),
            "level_passes": level_outcome(search, runs, result.experiment.repeats) is True,
            "oversaturated": sat,
        })  # fmt: skip
    rows.sort(key=lambda r: float(r[var]))
    cols = [Column(key=var, label=var), Column(key="passed", label="repeats passed"),
            Column(key="pass_probability", label="pass probability"), Column(key="pass_low", label="95 % low"),
            Column(key="pass_high", label="95 % high"), Column(key="goodput_ratio", label="goodput ratio"),
            Column(key="request_goodput", label="goodput", unit="req/s"), _col("p99_ttft_ms"), _col("p99_e2el_ms"),
            _col("error_ratio"), Column(key="verdicts", label="verdicts"), Column(key="level_passes", label="passes"),
            Column(key="oversaturated", label="over-saturated")]  # fmt: skip
    tables = [Table(name="levels", title=f"goodput and SLOs per {var} (the curve)", columns=cols, rows=rows)]
    good = [r for r in rows if r["level_passes"]]
    lo = max((float(r[var]) for r in good), default=None)
    bad = [r for r in rows if not r["level_passes"] and (lo is None or float(r[var]) > lo)]
    hi_row = min(bad, key=lambda r: float(r[var])) if bad else None
    lo_row = next((r for r in rows if lo is not None and float(r[var]) == lo), None)
    target = f"goodput ratio >= {search.goodput_target:g}" + (" and every SLO" if search.every_slo else "")
    if lo_row is None:
        finding = Finding(name="capacity_found", passed=None,
                          detail=f"no level down to {search.min:g} met {target}")  # fmt: skip
    elif hi_row is None:
        finding = Finding(name="capacity_found", passed=None,
                          detail=f"every level up to {search.max:g} met {target}: capacity >= {lo:g}")  # fmt: skip
    else:
        tables.append(Table(name="capacity", title=f"capacity under SLO ({target})", columns=[
            Column(key="capacity", label=f"highest passing {var}"),
            Column(key="next_failing", label=f"lowest failing {var}"),
            Column(key="pass_low", label="its pass probability, 95 % low"),
            Column(key="pass_high", label="its pass probability, 95 % high"),
        ], rows=[{"capacity": lo, "next_failing": float(hi_row[var]), "pass_low": lo_row["pass_low"],
                  "pass_high": lo_row["pass_high"]}]))  # fmt: skip
        finding = Finding(name="capacity_found", passed=True,
                          detail=f"capacity {var} = {lo:g} ({lo_row['passed']} repeats passed; {hi_row[var]:g} fails: "
                          f"{hi_row['passed']} passed)")  # fmt: skip
    result.tables = tables
    result.findings = [finding]
    result.plots = [Plot(name="goodput", title=f"goodput ratio vs {var}", x=var, x_label=var, y=["goodput_ratio"],
                         y_label="goodput ratio")]  # fmt: skip


def stopper(spec: Analysis) -> Callable[[Trial], str | None] | None:
    """burst with ``stop_on_failure``: stop once every repeat of a size failed."""
    if spec.kind != "burst" or not spec.stop_on_failure:
        return None

    def stop(trial: Trial) -> str | None:
        fails = run_failures(spec, trial)
        if fails and all(fails):
            return f"every repeat of {trial.name} failed ({fails[0][0]})"
        return None

    return stop


KINDS: dict[str, Callable[[Analysis, ExperimentResult, SLOConfig], None]] = {
    "table": table_analysis,
    "u_curve": u_curve_analysis,
    "fairness": fairness_analysis,
    "token_budget": token_budget_analysis,
    "burst": burst_analysis,
    "hot_swap": hot_swap_analysis,
    "lora_rank": lora_rank_analysis,
    "multi_lora": multi_lora_analysis,
}


def analyse(
    spec: Analysis, slos: SLOConfig, search: Search | None = None
) -> Callable[[ExperimentResult], ExperimentResult]:
    """The analysis of ``spec.kind``; its figure names may be ``{PARAM}`` templates (``y: "{metric}"``),
    filled from the result's parameters."""

    def run(result: ExperimentResult) -> ExperimentResult:
        params = {k: v for k, v in result.experiment.parameters.items() if not isinstance(v, list)}
        filled = spec.model_copy(
            update={k: str(getattr(spec, k)).format(**params) for k in ("x", "y", "throughput") if getattr(spec, k)}
        )
        if spec.kind == "search":
            assert search is not None
            search_analysis(filled, result, slos, search)
        else:
            KINDS[spec.kind](filled, result, slos)
        return result

    return run
