"""``multi_lora`` (guide 2.2): one adapter against N resident and served at once. The figures come from each
run's device watch (loadlens/experiment/device.py: ``vram.*``, ``frag.*``, ``util.*``) and its per-model
slices (``models.NAME.*``); docs/experiments.md, *multi-lora*, defines every column.

Tables: ``utilisation`` (the guide's: tasks, mean util, peak-to-trough, swing period), ``vram`` (per trial:
the adapters' requested, allocated and reserved bytes, rounding overhead, fragmentation), ``vram_steps`` (per
adapter in load order) and ``models`` (traffic figures per adapter and overall). Findings: the N-adapter trial
takes more adapter memory and swings more than the 1-adapter trial; null (not judged) where a figure is null.
"""

from __future__ import annotations

from loadlens.contracts.experiment_result import Column, ExperimentResult, Finding, Plot, Scalar, Table, Trial
from loadlens.contracts.slo import SLOConfig
from loadlens.experiment.models import Analysis

MIB = 2**20
STEP_KEYS = ("requested_bytes", "allocated_bytes", "reserved_bytes", "rounding_overhead_bytes")
MODEL_KEYS = (
    ("completed", "completed", "requests"),
    ("request_throughput", "throughput", "req/s"),
    ("mean_ttft_ms", "mean TTFT", "ms"),
    ("mean_tpot_ms", "mean TPOT", "ms"),
    ("p99_e2el_ms", "E2E p99", "ms"),
)
NO_UTIL = (
    "utilisation is null: the server gave no /sim/device-state samples (only the sim has them; a real "
    "vLLM on CPU has no GPU, and on a GPU host NVML's ~1/6 s average cannot resolve a swing of tens of ms)"
)
NO_VRAM = (
    "VRAM steps are null: neither /sim/device-state nor a probe document (--device-probe-dir) gave allocator "
    "readings (a real vLLM on CPU has no GPU allocator)"
)


def _mean(trial: Trial, key: str) -> float | None:
    stat = trial.figures.get(key)
    return None if stat is None else stat.mean


def _mib(value: float | None) -> float | None:
    return None if value is None else round(value / MIB, 3)


def _cols(*spec: tuple[str, str, str]) -> list[Column]:
    return [Column(key=k, label=label, unit=unit) for k, label, unit in spec]


def multi_lora_analysis(spec: Analysis, result: ExperimentResult, slos: SLOConfig) -> None:
    done = [t for t in result.trials if t.status == "done"]
    util_rows: list[dict[str, Scalar]] = []
    vram_rows: list[dict[str, Scalar]] = []
    step_rows: list[dict[str, Scalar]] = []
    model_rows: list[dict[str, Scalar]] = []
    for t in done:
        tasks = len(t.adapters)
        util_rows.append(
            {"trial": t.name, "tasks": tasks, **{k: _mean(t, f"util.{k}") for k in (
                "mean_pct", "peak_to_trough_pct", "swing_period_ms", "p5_pct", "p95_pct", "interval_ms", "samples")},
             **{f"busy_{k}": _mean(t, f"busy.{k}") for k in ("ratio_pct", "swing_pct", "period_ms", "gap_p95_ms")}}
        )  # fmt: skip
        ratio = _mean(t, "vram.rounding_overhead_ratio")
        vram_rows.append({
            "trial": t.name, "tasks": tasks,
            "requested_mib": _mib(_mean(t, "vram.adapters_requested_bytes")),
            "allocated_mib": _mib(_mean(t, "vram.adapters_allocated_bytes")),
            "reserved_mib": _mib(_mean(t, "vram.adapters_reserved_bytes")),
            "overhead_mib": _mib(_mean(t, "vram.rounding_overhead_bytes")),
            "overhead_ratio": None if ratio is None else round(ratio, 4),
            "free_block_ratio": _mean(t, "frag.free_block_ratio"),
            "inactive_split_ratio": _mean(t, "frag.inactive_split_ratio"),
        })  # fmt: skip
        for i, name in enumerate(t.adapters, 1):
            step: dict[str, Scalar] = {"trial": t.name, "step": i, "adapter": name}
            step.update({k: _mean(t, f"vram.{name}.{k}") for k in STEP_KEYS})
            step["rounding_overhead_ratio"] = _mean(t, f"vram.{name}.rounding_overhead_ratio")
            step_rows.append(step)
        for model in [*t.adapters, None]:
            prefix = f"models.{model}." if model else ""
            model_rows.append(
                {"trial": t.name, "model": model or "overall", **{k: _mean(t, prefix + k) for k, _, _ in MODEL_KEYS}}
            )
    result.tables = [
        Table(name="utilisation", title="GPU utilisation during the measured load (guide 2.2's table): "
                                                     "NVML-style samples, then the busy timeline",
              columns=_cols(("trial", "trial", ""), ("tasks", "tasks", "adapters"), ("mean_pct", "mean util", "%"),
                            ("peak_to_trough_pct", "peak-to-trough (p95 - p5)", "%"),
                            ("swing_period_ms", "swing period", "ms"), ("p5_pct", "p5", "%"), ("p95_pct", "p95", "%"),
                            ("interval_ms", "sample interval", "ms"), ("samples", "samples", ""),
                            ("busy_ratio_pct", "busy (timeline)", "%"),
                            ("busy_swing_pct", "swing, 10 ms bins (timeline)", "%"),
                            ("busy_period_ms", "period, 1 ms bins (timeline)", "ms"),
                            ("busy_gap_p95_ms", "idle gap p95 (timeline)", "ms")),
              rows=util_rows),
        Table(name="vram", title="adapter memory and fragmentation (adapters made resident one by one)",
              columns=_cols(("trial", "trial", ""), ("tasks", "tasks", "adapters"),
                            ("requested_mib", "requested", "MiB"), ("allocated_mib", "allocated", "MiB"),
                            ("reserved_mib", "reserved growth", "MiB"), ("overhead_mib", "rounding overhead", "MiB"),
                            ("overhead_ratio", "overhead / allocated", ""),
                            ("free_block_ratio", "1 - largest free / free", ""),
                            ("inactive_split_ratio", "inactive split / reserved", "")),
              rows=vram_rows),
        Table(name="vram_steps", title="VRAM step per adapter, in load order",
              columns=_cols(("trial", "trial", ""), ("step", "step", ""), ("adapter", "adapter", ""),
                            ("requested_bytes", "requested", "B"), ("allocated_bytes", "allocated", "B"),
                            ("reserved_bytes", "reserved", "B"), ("rounding_overhead_bytes", "rounding overhead", "B"),
                            ("rounding_overhead_ratio", "overhead / allocated", "")),
              rows=step_rows),
        Table(name="models", title="traffic per adapter (the load generator's per-model slices) and overall",
              columns=_cols(("trial", "trial", ""), ("model", "model", ""), *MODEL_KEYS), rows=model_rows),
    ]  # fmt: skip
    result.findings = _findings(done)
    result.plots = [
        Plot(name="vram_steps", title="VRAM step per adapter (bytes allocated)", x="step", x_label="adapter loaded",
             y=["allocated_bytes"], y_label="bytes"),
        Plot(name="utilisation", title="utilisation by trial", x="tasks", x_label="adapters",
             y=["mean_pct", "peak_to_trough_pct"], y_label="%"),
    ]  # fmt: skip


def _compare(name: str, one: Trial, many: Trial, key: str, what: str, unit: str, why_null: str) -> Finding:
    a, b = _mean(one, key), _mean(many, key)
    if a is None or b is None:
        return Finding(name=name, passed=None, detail=why_null)
    return Finding(
        name=name,
        passed=b > a,
        detail=f"{what}: {len(many.adapters)} adapters {b:.4g} {unit} against {len(one.adapters)}: {a:.4g} {unit}",
    )


def _findings(done: list[Trial]) -> list[Finding]:
    with_adapters = [t for t in done if t.adapters]
    if len({len(t.adapters) for t in with_adapters}) < 2:
        return [Finding(name="compared", passed=None, detail="needs finished trials with two adapter counts")]
    one = min(with_adapters, key=lambda t: len(t.adapters))
    many = max(with_adapters, key=lambda t: len(t.adapters))
    return [
        _compare("more_adapter_memory", one, many, "vram.adapters_allocated_bytes", "adapter bytes allocated",
                 "B", NO_VRAM),
        _compare("larger_swing", one, many, "util.peak_to_trough_pct", "utilisation peak-to-trough (p95 - p5)",
                 "%", NO_UTIL),
    ]  # fmt: skip
