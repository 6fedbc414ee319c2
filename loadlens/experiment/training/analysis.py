"""The training experiments' analyses: from the trials' per-run figures to the guide's tables (2.3: crash rate
and convergence-step deviation; 2.5: grad-norm std and validation-loss change), the telemetry and alerts per
configuration, findings and plots. docs/experiments.md defines every column."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from loadlens.contracts.experiment_result import Column, ExperimentResult, Finding, Plot, Scalar, Table, Trial
from loadlens.experiment.analysis.analyse import wilson
from loadlens.experiment.training.definitions import boundary, deviation
from loadlens.experiment.training.spec import TrainingAnalysis


def _values(t: Trial, key: str) -> list[float | None]:
    stat = t.figures.get(key)
    return list(stat.values) if stat is not None else []


def _mean(t: Trial, key: str) -> float | None:
    stat = t.figures.get(key)
    return None if stat is None else stat.mean


def _count(t: Trial, key: str) -> int:
    return sum(1 for v in _values(t, key) if v)


def _done(result: ExperimentResult) -> list[Trial]:
    return [t for t in result.trials if t.status == "done"]


ALERT_NAMES = {
    "alert.grad_norm_jump": "GradNormJump",
    "alert.memory_fluctuation": "VramPeakFluctuation",
    "alert.lora_correlation": "LoraUpdateCorrelationLow",
}


def _pair(trials: list[Trial], t: Trial, key: str) -> Trial | None:
    """The trial whose params equal ``t``'s except ``key``."""
    rest = {k: v for k, v in t.params.items() if k != key}
    return next((o for o in trials if o is not t and {k: v for k, v in o.params.items() if k != key} == rest
                 and o.params.get(key) != t.params.get(key)), None)  # fmt: skip


def _same_trajectory(a: Trial, b: Trial, what: str, key: str, tolerance: float) -> Finding:
    diffs = [
        abs(x - y) for x, y in zip(_values(a, key), _values(b, key), strict=False) if x is not None and y is not None
    ]
    name = f"{what}_leaves_training_unchanged"
    if not diffs:
        return Finding(name=name, passed=None, detail=f"{a.name} vs {b.name}: no run pair to compare")
    worst = max(diffs)
    return Finding(name=name, passed=worst <= tolerance, detail=f"{a.name} vs {b.name}, {len(diffs)} seeds: largest "
                   f"difference of the summed training loss {worst:.3g} (bound {tolerance:g})")  # fmt: skip


def stability_analysis(spec: TrainingAnalysis, result: ExperimentResult) -> None:
    trials = _done(result)
    base = next((t for t in trials if t.name == spec.baseline), trials[0] if trials else None)
    base_conv = _mean(base, "convergence_step") if base is not None else None
    rows: list[dict[str, Scalar]] = []
    tele: list[dict[str, Scalar]] = []
    per_run: list[dict[str, Scalar]] = []
    for t in trials:
        n, k = len(t.runs), _count(t, "crashed")
        low, high = wilson(k, n)
        conv = _mean(t, "convergence_step")
        dev = deviation(conv, base_conv)
        rows.append({
            "configuration": t.name, "runs": n, "crashes": k, "crash_rate": k / n if n else None,
            "crash_low": low, "crash_high": high, "converged": _count(t, "converged"),
            "convergence_step": conv, "convergence_deviation": None if dev is None else dev * 100.0,
            "checkpoints_saved": _mean(t, "checkpoints_saved"),
        })  # fmt: skip
        tele.append({
            "configuration": t.name,
            "memory": "CUDA allocator peak" if _mean(t, "memory_on_cuda") else "process RSS",
            "memory_fluctuation_max": _mean(t, "memory_fluctuation_max"),
            "grad_norm_jumps": _mean(t, "grad_norm_jumps"),
            "max_jump_ratio": max((v for v in _values(t, "max_jump_ratio") if v is not None), default=None),
            "ab_correlation_min": min((v for v in _values(t, "ab_correlation_min") if v is not None), default=None),
            "ab_correlation_mean": _mean(t, "ab_correlation_mean"),
            **{key: f"{_count(t, key)}/{n}" for key in ALERT_NAMES},
        })  # fmt: skip
        for run in t.runs:
            f = run.figures
            fired = [label for key, label in ALERT_NAMES.items() if f.get(key)]
            crash = next((k.split(".")[1] for k in ("crash.non_finite", "crash.divergence", "crash.oom") if f.get(k)),
                         None)  # fmt: skip
            per_run.append({
                "configuration": t.name, "seed": f.get("seed"), "crash": crash, "crash_step": f.get("crash_step"),
                "convergence_step": f.get("convergence_step"), "grad_norm_jumps": f.get("grad_norm_jumps"),
                "correlation_low_steps": f.get("correlation_low_steps"), "alerts": ", ".join(fired) or None,
            })  # fmt: skip
    cfg_col = Column(key="configuration", label="configuration")
    result.tables = [
        Table(name="stability", title=f"crash rate and convergence steps (deviation against {spec.baseline})",
              columns=[cfg_col, Column(key="runs", label="runs"), Column(key="crashes", label="crashes"),
                       Column(key="crash_rate", label="crash rate"), Column(key="crash_low", label="95 % low"),
                       Column(key="crash_high", label="95 % high"), Column(key="converged", label="converged"),
                       Column(key="convergence_step", label="convergence step", unit="steps"),
                       Column(key="convergence_deviation", label="convergence steps", unit="%"),
                       Column(key="checkpoints_saved", label="checkpoints saved")], rows=rows),
        Table(name="telemetry", title="telemetry per configuration (means over runs; alerts: runs where it fires)",
              columns=[cfg_col, Column(key="memory", label="memory source"),
                       Column(key="memory_fluctuation_max", label="memory peak fluctuation max"),
                       Column(key="grad_norm_jumps", label="grad-norm jumps > 3x EMA"),
                       Column(key="max_jump_ratio", label="largest jump ratio"),
                       Column(key="ab_correlation_min", label="ΔA/ΔB correlation min"),
                       Column(key="ab_correlation_mean", label="ΔA/ΔB correlation mean"),
                       *(Column(key=k, label=f"{v} fires") for k, v in ALERT_NAMES.items())], rows=tele),
        Table(name="alerts", title="per run: crash and the alerts that would fire",
              columns=[cfg_col, Column(key="seed", label="seed"), Column(key="crash", label="crash"),
                       Column(key="crash_step", label="crash step"),
                       Column(key="convergence_step", label="converged at"),
                       Column(key="grad_norm_jumps", label="jumps"),
                       Column(key="correlation_low_steps", label="steps with correlation < min"),
                       Column(key="alerts", label="alerts firing")], rows=per_run),
    ]  # fmt: skip
    findings = []
    cuda = any(_mean(t, "memory_on_cuda") for t in trials)
    for t in trials:
        if t.params.get("checkpoints") == "dynamic" and (o := _pair(trials, t, "checkpoints")) is not None:
            # bit-identical on CPU; CUDA kernels may sum in another order from run to run
            findings.append(_same_trajectory(t, o, "dynamic_rule", "train_loss_sum", 1e-3 if cuda else 0.0))
        if t.params.get("gradient_checkpointing") is True and (o := _pair(trials, t, "gradient_checkpointing")):
            findings.append(_same_trajectory(t, o, "gradient_checkpointing", "train_loss_sum", 1e-3))
    crashed = [r for r in rows if r["crashes"]]
    findings.append(Finding(name="crashes", passed=None, detail="; ".join(
        f"{r['configuration']}: {r['crashes']}/{r['runs']}" for r in crashed) or "no run crashed"))  # fmt: skip
    result.findings = findings
    result.plots = []


def accumulation_analysis(spec: TrainingAnalysis, result: ExperimentResult) -> None:
    trials = sorted(_done(result), key=lambda t: float(t.params.get("accumulation", 0)))  # type: ignore[arg-type]
    rows: list[dict[str, Any]] = []
    ref = _mean(trials[0], "final_val_loss") if trials else None
    for t in trials:
        loss = _mean(t, "final_val_loss")
        change = None if loss is None or ref is None else loss - ref
        rows.append({
            "accumulation": t.params.get("accumulation"), "optimizer_steps": _mean(t, "optimizer_steps"),
            "lora_a_grad_norm_std": _mean(t, "lora_a_grad_norm_std"),
            "lora_b_grad_norm_std": _mean(t, "lora_b_grad_norm_std"), "grad_norm_std": _mean(t, "grad_norm_std"),
            "final_val_loss": loss, "val_loss_change": change,
            "exceeds": None if change is None else change > spec.threshold,
        })  # fmt: skip
    edge = boundary([(float(r["accumulation"]), r["val_loss_change"]) for r in rows], spec.threshold)
    cols = [Column(key="accumulation", label="accumulation steps"),
            Column(key="optimizer_steps", label="optimiser steps"),
            Column(key="lora_a_grad_norm_std", label="grad-norm std lora_A"),
            Column(key="lora_b_grad_norm_std", label="grad-norm std lora_B"),
            Column(key="grad_norm_std", label="grad-norm std (all trainable)"),
            Column(key="final_val_loss", label="validation loss", unit="nats"),
            Column(key="val_loss_change", label="validation-loss change", unit="nats"),
            Column(key="exceeds", label=f"change > {spec.threshold:g}")]  # fmt: skip
    result.tables = [
        Table(
            name="accumulation",
            title="grad-norm spread and validation-loss change per accumulation "
            "(means over seeds; change against the smallest setting)",
            columns=cols,
            rows=rows,
        )
    ]
    result.tables.append(
        Table(
            name="boundary",
            title="boundary",
            columns=[
                Column(key="boundary", label="first accumulation whose change exceeds the threshold"),
                Column(key="threshold", label="threshold", unit="nats"),
            ],
            rows=[{"boundary": edge, "threshold": spec.threshold}],
        )
    )
    result.plots = [
        Plot(name="grad_norm_std", title="grad-norm std vs accumulation steps", x="accumulation",
             x_label="accumulation steps", y=["lora_a_grad_norm_std", "lora_b_grad_norm_std"],
             y_label="grad-norm std", log_x=True),
        Plot(name="val_loss_change", title="validation-loss change vs accumulation steps", x="accumulation",
             x_label="accumulation steps", y=["val_loss_change"], y_label="change (nats)", log_x=True),
    ]  # fmt: skip
    findings = [
        Finding(
            name="boundary",
            passed=None,
            detail=f"first accumulation with a change > {spec.threshold:g} nats: {edge:g}"
            if edge is not None
            else f"no setting changes the loss by > {spec.threshold:g}",
        )
    ]
    for key in ("lora_a_grad_norm_std", "lora_b_grad_norm_std"):
        lo, hi = (rows[0][key], rows[-1][key]) if len(rows) >= 2 else (None, None)
        if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
            findings.append(Finding(name=f"{key}_falls", passed=None, detail="needs two settings with a spread"))
            continue
        findings.append(Finding(
            name=f"{key}_falls", passed=hi < lo,
            detail=f"{lo:.4g} at accumulation {rows[0]['accumulation']} vs {hi:.4g} at {rows[-1]['accumulation']} "
            "(averaging k micro-batch gradients divides their noise variance by k: the spread should fall)",
        ))  # fmt: skip
    result.findings = findings


KINDS: dict[str, Callable[[TrainingAnalysis, ExperimentResult], None]] = {
    "training_stability": stability_analysis,
    "accumulation_sensitivity": accumulation_analysis,
}


def training_analyse(spec: TrainingAnalysis) -> Callable[[ExperimentResult], ExperimentResult]:
    def run(result: ExperimentResult) -> ExperimentResult:
        KINDS[spec.kind](spec, result)
        return result

    return run
