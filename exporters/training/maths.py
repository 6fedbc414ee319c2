"""The telemetry maths, free of torch and Prometheus so it can be checked against hand-computed values.

Definitions (docs/training.md states the same):

- EMA of the gradient L2 norm: ``ema_1 = g_1``, ``ema_t = beta * ema_(t-1) + (1 - beta) * g_t``.
- Jump ratio: ``g_t / ema_(t-1)``, the norm against the average of the steps *before* it (a spike must not
  dilute its own baseline); undefined on the first step. A jump is a ratio above the SLO file's factor (3).
- VRAM peak fluctuation: ``(max - min) / mean`` of the per-step peak allocated bytes over the last N steps.
- LoRA A/B update correlation of one module: the Pearson correlation of the module's effective weight update
  in consecutive optimiser steps, ``dW_t = B_t A_t - B_(t-1) A_(t-1)``, i.e. ``corr(vec dW_t, vec dW_(t-1))``.
- Checkpoint rule (guide 2.3): save when step % 4 == 0 and the population variance of the last 8 gradient
  norms exceeds 0.025 (a full window is required).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from loadlens.contracts.slo import SLOConfig


class Ema:
    """Exponential moving average seeded with the first value (no bias towards zero)."""

    def __init__(self, beta: float = 0.9) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1): {beta}")
        self.beta = beta
        self.value: float | None = None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else self.beta * self.value + (1.0 - self.beta) * x
        return self.value


def jump_ratio(norm: float, previous_ema: float | None) -> float | None:
    """``norm / previous_ema``; None before there is a baseline or when the baseline is zero."""
    if previous_ema is None or previous_ema <= 0.0 or not math.isfinite(previous_ema):
        return None
    return norm / previous_ema


class Window:
    """The last ``size`` values, with the statistics the series need."""

    def __init__(self, size: int) -> None:
        if size < 2:
            raise ValueError(f"a window needs at least 2 values: {size}")
        self.size = size
        self.values: deque[float] = deque(maxlen=size)

    def add(self, x: float) -> None:
        self.values.append(x)

    @property
    def full(self) -> bool:
        return len(self.values) == self.size

    def variance(self) -> float | None:
        """Population variance (divide by n), as the guide's 'variance of the last 8'; None under 2 values."""
        n = len(self.values)
        if n < 2:
            return None
        mean = sum(self.values) / n
        return sum((v - mean) ** 2 for v in self.values) / n

    def fluctuation(self) -> float | None:
        """``(max - min) / mean``; None under 2 values or a zero mean."""
        if len(self.values) < 2:
            return None
        mean = sum(self.values) / len(self.values)
        if mean <= 0.0:
            return None
        return (max(self.values) - min(self.values)) / mean


def pearson(x: Sequence[float] | Iterable[float], y: Sequence[float] | Iterable[float]) -> float | None:
    """Pearson correlation of two equal-length sequences; None when either is constant (undefined)."""
    xs, ys = list(x), list(y)
    if len(xs) != len(ys):
        raise ValueError(f"lengths differ: {len(xs)} vs {len(ys)}")
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(xs, ys, strict=True))
    sxx = sum((a - mx) ** 2 for a in xs)
    syy = sum((b - my) ** 2 for b in ys)
    if sxx <= 0.0 or syy <= 0.0:
        return None
    return sxy / math.sqrt(sxx * syy)


@dataclass(frozen=True)
class Decision:
    step: int
    save: bool
    variance: float | None


@dataclass
class CheckpointPolicy:
    """Guide 2.3's dynamic checkpoint rule: on every ``every``-th step, save if the gradient norm varied."""

    variance_threshold: float = 0.025
    window_steps: int = 8
    every: int = 4
    _norms: Window = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1: {self.every}")
        self._norms = Window(self.window_steps)

    @classmethod
    def from_slos(cls, slos: SLOConfig) -> CheckpointPolicy:
        t = slos.training
        return cls(
            variance_threshold=t["checkpoint_grad_norm_variance"],
            window_steps=int(t["checkpoint_window_steps"]),
            every=int(t.get("checkpoint_every_steps", 4)),
        )

    def observe(self, step: int, grad_norm: float) -> Decision | None:
        """Record step ``step``'s norm; on a decision step return the decision, otherwise None."""
        self._norms.add(grad_norm)
        if step % self.every != 0:
            return None
        var = self._norms.variance() if self._norms.full else None
        return Decision(step, var is not None and var > self.variance_threshold, var)
