"""``hot_swap`` (guide 2.4): per trial and per model (adapter), the time requests were blocked behind adapter
swaps, the share delayed longer than the SLO file's ``lora_swap.delay_seconds`` and the verdict against its
``lora_swap.max_delayed_ratio``, from the serving layer's own series on the target's ``/metrics``
(loadlens/experiment/swap_series.py: what is exact, what is interpolated).

Two populations, kept apart: the blocking histogram holds only requests blocked more than 0 s, so the mean and
P99 are *per blocked request* (the guide's figures), while the delayed share is over *every* successful
request (``loadlens_slo_eligible_requests_total``), the SLA's denominator.
"""

from __future__ import annotations

from loadlens.contracts.experiment_result import Column, ExperimentResult, Finding, Scalar, Table, Trial
from loadlens.contracts.slo import SLOConfig
from loadlens.experiment.models import Analysis

COLUMNS = [
    Column(key="trial", label="trial"),
    Column(key="mode", label="swaps"),
    Column(key="model", label="model"),
    Column(key="rank", label="rank"),
    Column(key="mean_blocked_ms", label="mean block (per blocked request)", unit="ms"),
    Column(key="p99_blocked_ms", label="P99 block (per blocked request)", unit="ms"),
    Column(key="sla_met", label="SLA met"),
    Column(key="delayed_ratio", label="delayed share"),
    Column(key="blocked_ratio", label="blocked share"),
    Column(key="requests", label="requests"),
    Column(key="blocked_requests", label="blocked"),
    Column(key="delayed_requests", label="delayed"),
    Column(key="swaps", label="swaps"),
]
SOURCES = [
    Column(key="trial", label="trial"),
    Column(key="swaps", label="swaps"),
    Column(key="swaps_source", label="swap count from"),
    Column(key="driver_loads", label="driver loads"),
    Column(key="sim_adapter_load_mean_ms", label="sim adapter load mean", unit="ms"),
    Column(key="vllm_adapter_load_mean_ms", label="vLLM adapter load mean", unit="ms"),
    Column(key="probe_swap_windows", label="probe swap windows"),
    Column(key="delayed_counter", label="server's delayed counter"),
    Column(key="delay_exact", label="delayed count exact"),
]


def _mean(trial: Trial, key: str) -> float | None:
    stat = trial.figures.get(key)
    return None if stat is None else stat.mean


def _last_sample_text(trial: Trial, attr: str) -> Scalar:
    for run in reversed(trial.runs):
        if run.error is None and run.server.lora_swap is not None:
            value = getattr(run.server.lora_swap, attr)
            return value if isinstance(value, str | bool) or value is None else str(value)
    return None


def _met(ratio: float | None, bound: float) -> bool | None:
    return None if ratio is None else ratio <= bound


def hot_swap_analysis(spec: Analysis, result: ExperimentResult, slos: SLOConfig) -> None:
    bound, delay = slos.lora_swap.max_delayed_ratio, slos.lora_swap.delay_seconds
    ranks = {a.name: a.rank for a in result.adapters}
    rows: list[dict[str, Scalar]] = []
    sources: list[dict[str, Scalar]] = []
    findings: list[Finding] = []
    for t in (t for t in result.trials if t.status == "done"):
        mode = t.params.get("mode")
        prefixes = [("all", "swap.")]
        models = sorted(
            k[len("swap.models.") : -len(".requests")]
            for k in t.figures
            if k.startswith("swap.models.") and k.endswith(".requests")
        )
        prefixes += [(m, f"swap.models.{m}.") for m in models]
        for model, prefix in prefixes:
            if model != "all" and not _mean(t, prefix + "requests"):
                continue  # a served model no request of the run named (the base model, the swapped adapter)
            ratio = _mean(t, prefix + "delayed_ratio")
            rows.append({
                "trial": t.name, "mode": mode, "model": model, "rank": ranks.get(model),
                "mean_blocked_ms": _mean(t, prefix + "mean_blocked_ms"),
                "p99_blocked_ms": _mean(t, prefix + "p99_blocked_ms"),
                "sla_met": _met(ratio, bound), "delayed_ratio": ratio,
                "blocked_ratio": _mean(t, prefix + "blocked_ratio"), "requests": _mean(t, prefix + "requests"),
                "blocked_requests": _mean(t, prefix + "blocked_requests"),
                "delayed_requests": _mean(t, prefix + "delayed_requests"),
                "swaps": _mean(t, "swap.swaps") if model == "all" else None,
            })  # fmt: skip
        vllm = {k.rsplit(".", 1)[1]: _mean(t, k) for k in t.figures if k.startswith("swap.vllm_adapter_load_mean_ms.")}
        sources.append({
            "trial": t.name, "swaps": _mean(t, "swap.swaps"), "swaps_source": _last_sample_text(t, "swaps_source"),
            "driver_loads": _mean(t, "swap.driver_loads"),
            "sim_adapter_load_mean_ms": _mean(t, "swap.sim_adapter_load_mean_ms"),
            "vllm_adapter_load_mean_ms": ", ".join(f"{k} {v:.1f}" for k, v in sorted(vllm.items()) if v is not None)
            or None,
            "probe_swap_windows": _mean(t, "swap.probe_swap_windows"),
            "delayed_counter": _mean(t, "swap.delayed_counter"),
            "delay_exact": _last_sample_text(t, "delay_exact"),
        })  # fmt: skip
        ratio, requests = _mean(t, "swap.delayed_ratio"), _mean(t, "swap.requests")
        if ratio is None or not requests:
            detail = f"{t.name}: the target exports no hot-swap series or served no request"
            findings.append(Finding(name=f"sla_met.{t.name}", passed=None, detail=detail))
            continue
        mean, p99 = _mean(t, "swap.mean_blocked_ms"), _mean(t, "swap.p99_blocked_ms")
        per_blocked = (
            f"mean {mean:.1f} ms, P99 {p99:.1f} ms per blocked request" if mean is not None and p99 is not None
            else "no request blocked"
        )  # fmt: skip
        findings.append(Finding(
            name=f"sla_met.{t.name}", passed=ratio <= bound,
            detail=f"{t.name}: {_mean(t, 'swap.delayed_requests') or 0:g} of {requests:g} requests "
            f"({100 * ratio:.2f} %) "
            f"delayed > {delay * 1000:g} ms (bound {100 * bound:g} %); {per_blocked}",
        ))  # fmt: skip
        swaps = _mean(t, "swap.swaps")
        findings.append(Finding(
            name=f"swaps_seen.{t.name}", passed=None if swaps is None else swaps > 0,
            detail=f"{t.name}: {swaps if swaps is not None else 'no'} swaps ({_last_sample_text(t, 'swaps_source')})",
        ))  # fmt: skip
    result.tables = [
        Table(name="hot_swap", title=f"hot-swap interruption per trial and model (SLA: at most {100 * bound:g} % of "
              f"requests delayed > {delay * 1000:g} ms)", columns=COLUMNS, rows=rows),
        Table(name="sources", title="where the swap figures come from", columns=SOURCES, rows=sources),
    ]  # fmt: skip
    result.findings = findings
    result.plots = []
