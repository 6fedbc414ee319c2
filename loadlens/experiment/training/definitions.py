"""The definitions of the training procedures (guide 2.3, 2.5), free of torch so each is checked on
constructed curves with known answers. docs/training.md, *Training experiments*, states the same.

- **crash** (``crash_after_step``): after a step, the run has crashed when its training loss is not finite
  (``non_finite``), or when the mean training loss of the last ``window`` steps exceeds ``ratio`` x the first
  step's loss (``divergence``); an out-of-memory error during a step is the third kind (``oom``, the engine).
  The run stops at its crash step.
- **smoothed validation loss**: the mean of the last ``k`` evaluations (fewer at the start).
- **convergence step** (``convergence_step``): the step of the first evaluation whose smoothed validation
  loss is <= the target; None when no evaluation reaches it (or the run crashed first).
- **convergence deviation**: (mean convergence step of a configuration - that of the baseline) / baseline's,
  over the runs that converged.
- **crash rate**: crashes / runs, with the 95 % Wilson score interval.
- **alerts** (``alerts``): which of the three training alerts would fire on the run's per-step series.
- **boundary** (``boundary``): the first accumulation setting whose validation-loss change against the
  smallest setting exceeds the threshold.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CORRELATION_ALERT_FOR_S = 60.0
"""``for: 1m`` of LoadlensTrainingLoraUpdateCorrelationLow (loadlens/alerting/system_rules.py; a test keeps
the two equal)."""


@dataclass(frozen=True)
class Crash:
    step: int
    kind: str
    """``non_finite``, ``divergence`` or ``oom``."""
    detail: str


def crash_after_step(losses: Sequence[float], ratio: float, window: int) -> Crash | None:
    """The crash the last step of ``losses`` (the training loss of steps 1..t) shows, or None."""
    if not losses:
        return None
    step, last = len(losses), losses[-1]
    if not math.isfinite(last):
        return Crash(step, "non_finite", f"training loss {last} at step {step}")
    first = losses[0]
    if len(losses) >= window and math.isfinite(first) and first > 0:
        mean = statistics.fmean(losses[-window:])
        if mean > ratio * first:
            return Crash(step, "divergence", f"mean loss of the last {window} steps {mean:.4g} > {ratio:g} x "
                         f"the first step's {first:.4g}")  # fmt: skip
    return None


def smoothed(values: Sequence[float], k: int) -> list[float]:
    """Trailing means over the last ``k`` values (fewer at the start)."""
    return [statistics.fmean(values[max(0, i + 1 - k) : i + 1]) for i in range(len(values))]


def convergence_step(evals: Sequence[tuple[int, float]], target: float, k: int) -> int | None:
    """The first evaluation step whose smoothed validation loss is <= ``target``."""
    smooth = smoothed([v for _, v in evals], k)
    return next((step for (step, _), s in zip(evals, smooth, strict=True) if s <= target), None)


def deviation(value: float | None, baseline: float | None) -> float | None:
    """(value - baseline) / baseline; None when either is missing or the baseline is 0."""
    if value is None or baseline is None or baseline == 0:
        return None
    return (value - baseline) / baseline


@dataclass(frozen=True)
class AlertOutcome:
    grad_norm_jump_steps: list[int]
    """Steps whose gradient norm exceeded jump_factor x its EMA: LoadlensTrainingGradNormJump fires on each."""
    memory_fluctuation_steps: list[int]
    """Steps whose memory fluctuation (max - min) / mean over the last ``window`` steps reached the bound:
    LoadlensTrainingVramPeakFluctuation on CUDA (on CPU the same test on the process RSS, no alert exists)."""
    correlation_low_steps: list[int]
    """Steps where some LoRA module's update correlation was below the minimum."""
    correlation_alert: bool
    """LoadlensTrainingLoraUpdateCorrelationLow would fire: one module's correlation stayed below the minimum
    for consecutive steps lasting >= ``for_s`` seconds of the run's step time (the rule's ``for: 1m``)."""


def fluctuation(values: Sequence[float]) -> float | None:
    """(max - min) / mean, the exporters' VRAM fluctuation (maths.Window.fluctuation), of ``values``."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return (max(values) - min(values)) / mean if mean > 0 else None


def alerts(
    steps: Sequence[int],
    jumps: Sequence[bool],
    memory: Sequence[float | None],
    correlations: Sequence[dict[str, float]],
    seconds: Sequence[float],
    *,
    window: int,
    fluctuation_bound: float,
    correlation_min: float,
    for_s: float = CORRELATION_ALERT_FOR_S,
) -> AlertOutcome:
    jump_steps = [s for s, j in zip(steps, jumps, strict=True) if j]
    mem_steps = []
    for i, s in enumerate(steps):
        recent = [m for m in memory[max(0, i + 1 - window) : i + 1] if m is not None]
        f = fluctuation(recent)
        if f is not None and f >= fluctuation_bound:
            mem_steps.append(s)
    low_steps = [s for s, c in zip(steps, correlations, strict=True) if any(r < correlation_min for r in c.values())]
    held: dict[str, float] = {}
    fired = False
    for c, sec in zip(correlations, seconds, strict=True):
        for module in set(held) | set(c):
            if module in c and c[module] < correlation_min:
                held[module] = held.get(module, 0.0) + sec
                fired = fired or held[module] >= for_s
            else:
                held.pop(module, None)
    return AlertOutcome(jump_steps, mem_steps, low_steps, fired)


def spread(values: Sequence[float | None], measure_from: float) -> float | None:
    """Sample standard deviation of the values after the first ``measure_from`` fraction (None under 2)."""
    tail = [v for v in values[int(len(values) * measure_from) :] if v is not None and math.isfinite(v)]
    return statistics.stdev(tail) if len(tail) >= 2 else None


def boundary(settings: Sequence[tuple[float, float | None]], threshold: float) -> float | None:
    """The first setting (in the given order) whose change exceeds ``threshold``; None when none does."""
    return next((x for x, change in settings if change is not None and change > threshold), None)
