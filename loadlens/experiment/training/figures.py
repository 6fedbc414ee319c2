"""A training run's figures (``TrialRun.figures``; docs/experiments.md, *Training experiments*, defines each
key) from its record, by the definitions of definitions.py."""

from __future__ import annotations

import statistics

from loadlens.contracts.slo import SLOConfig
from loadlens.experiment.training.config import TrainConfig
from loadlens.experiment.training.definitions import AlertOutcome, alerts, convergence_step, fluctuation, spread
from loadlens.experiment.training.engine import RunRecord


def _flag(value: bool) -> float:
    return 1.0 if value else 0.0


def run_figures(cfg: TrainConfig, record: RunRecord, slos: SLOConfig) -> tuple[dict[str, float | None], AlertOutcome]:
    steps = record.steps
    window = int(slos.training["checkpoint_window_steps"])
    outcome = alerts(
        [s.step for s in steps], [s.jump for s in steps], [s.memory_bytes for s in steps],
        [s.ab_correlation for s in steps], [s.seconds for s in steps],
        window=window, fluctuation_bound=slos.gpu["vram_fluctuation_ratio"],
        correlation_min=slos.training["lora_ab_correlation_min"],
    )  # fmt: skip
    crash = record.crash
    conv = None if crash is not None else convergence_step(record.evals, cfg.target_loss, cfg.smoothing)
    memory = [s.memory_bytes for s in steps if s.memory_bytes is not None]
    flucts = [fluctuation(memory[max(0, i + 1 - window) : i + 1]) for i in range(len(memory))]
    corr = [r for s in steps for r in s.ab_correlation.values()]
    ratios = [s.jump_ratio for s in steps if s.jump_ratio is not None]
    saves = [s.step for s in steps if s.saved]
    decisions = [s for s in steps if s.decision is not None]
    finite = [s.loss for s in steps]
    out: dict[str, float | None] = {
        "seed": float(cfg.seed),
        "crashed": _flag(crash is not None),
        "crash_step": None if crash is None else float(crash.step),
        "crash.non_finite": _flag(crash is not None and crash.kind == "non_finite"),
        "crash.divergence": _flag(crash is not None and crash.kind == "divergence"),
        "crash.oom": _flag(crash is not None and crash.kind == "oom"),
        "converged": _flag(conv is not None),
        "convergence_step": None if conv is None else float(conv),
        "steps_run": float(len(steps)),
        "optimizer_steps": float(cfg.total_steps),
        "accumulation": float(cfg.accumulation),
        "initial_val_loss": record.evals[0][1] if record.evals else None,
        "final_val_loss": record.evals[-1][1] if record.evals and crash is None else None,
        "loss_floor": record.loss_floor,
        "final_train_loss": finite[-1] if finite and crash is None else None,
        "train_loss_sum": sum(finite) if finite and crash is None else None,
        "grad_norm_mean": statistics.fmean(g)
        if (g := [s.grad_norm for s in steps if s.grad_norm is not None])
        else None,
        "grad_norm_std": spread([s.grad_norm for s in steps], cfg.measure_from),
        "lora_a_grad_norm_std": spread([s.grad_norm_lora_a for s in steps], cfg.measure_from),
        "lora_b_grad_norm_std": spread([s.grad_norm_lora_b for s in steps], cfg.measure_from),
        "grad_norm_jumps": float(len(outcome.grad_norm_jump_steps)),
        "max_jump_ratio": max(ratios) if ratios else None,
        "memory_peak_bytes": max(memory) if memory else None,
        "memory_fluctuation_max": max((f for f in flucts if f is not None), default=None),
        "memory_on_cuda": _flag(record.memory_source == "cuda_allocator_peak"),
        "ab_correlation_min": min(corr) if corr else None,
        "ab_correlation_mean": statistics.fmean(corr) if corr else None,
        "correlation_low_steps": float(len(outcome.correlation_low_steps)),
        "alert.grad_norm_jump": _flag(bool(outcome.grad_norm_jump_steps)),
        "alert.memory_fluctuation": _flag(bool(outcome.memory_fluctuation_steps)),
        "alert.lora_correlation": _flag(outcome.correlation_alert),
        "checkpoints_saved": float(len(saves)),
        "checkpoint_decisions": float(len(decisions)) if cfg.checkpoints == "dynamic" else None,
        "checkpoint_seconds": record.checkpoint_seconds,
        "steps_lost_at_crash": None if crash is None else float(crash.step - max(saves, default=0)),
        "trainable_parameters": float(record.trainable_parameters),
        "gradient_checkpointing": _flag(record.gradient_checkpointing),
        "train_seconds": record.seconds,
    }
    return out, outcome
