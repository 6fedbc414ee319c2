"""The engine step's spread around its mean, from vLLM's own step log, for the profile's
``step_spread_seconds`` (docs/calibration.md, *The step's spread*).

The fit prices each step at a mean (the stage rows are vLLM's histogram means, the log rows the logged steps'
means), so a sim whose steps all take their modeled time has its ITL median on that mean, where a real
engine's steps are skewed: a body below the mean and a tail above it. On the CPU rig the spread is the same
in milliseconds at every batch (a standard deviation of 1.8-2.0 ms, a P99 7.6-7.9 ms above the mean, for
decode-only steps of 9 to 11.5 ms) and not much wider on a 35 ms prefill: time the host takes, not a share
of the step, so it is added, not multiplied. Each decode-only step the log places in a fitted stage's runs,
in a (stage, batch) group of at least ``LEAST`` steps, gives its difference from its group's mean; the
differences of every group pooled, sorted, cut into ``POINTS`` shares of equal count, and each share's mean is
one value. Equal shares of differences whose mean is 0 have values of mean 0, so the sim's step keeps the
fitted mean and gains the measured median and tail.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from exporters.serving.calibrate.iteration_log import LEAST, LoggedStep, decode_steps
from exporters.serving.calibrate.observations import Stage

POINTS = 50
"""Values written: each the mean of 2 % of the steps, so the sim's P99 step is its top 2 %'s mean."""
DIGITS = 7
"""Decimals of a second each value is written with (the profile's check allows a mean 1e-6 s from 0)."""


@dataclass(frozen=True, slots=True)
class StepSpread:
    values: tuple[float, ...]
    """Seconds, ascending, mean 0 (empty when the log had fewer than ``POINTS`` steps)."""
    steps: int
    groups: int

    def quantile(self, q: float) -> float:
        """The value covering probability ``q`` (0 < q < 1) of a step drawn from it."""
        return self.values[min(len(self.values) - 1, int(q * len(self.values)))]

    def tail_s(self) -> float:
        """P99 − P50: what the spread alone puts between a replay's median interval and its P99 (0 without)."""
        return self.quantile(0.99) - self.quantile(0.5) if self.values else 0.0

    def as_dict(self) -> dict[str, object]:
        """``--json``'s ``step_spread``."""
        return {"values": list(self.values), "steps": self.steps, "groups": self.groups}

    def note(self) -> str:
        if not self.values:
            return f"none: {self.steps} decode-only steps in the fitted stages' groups, fewer than {POINTS}"
        q = ", ".join(f"P{round(p * 100)} {self.quantile(p) * 1000:+.2f}" for p in (0.1, 0.5, 0.9, 0.99))
        return (f"{self.steps} decode-only steps in {self.groups} (stage, batch) groups, each against its group's "
                f"mean, ms: {q}; the sim adds one of its {len(self.values)} values to each step")  # fmt: skip


def measure(stages: Sequence[Stage], steps: Sequence[LoggedStep], points: int = POINTS) -> StepSpread:
    """The spread of the decode-only steps ``steps`` places in ``stages``' runs."""
    diffs: list[float] = []
    groups = 0
    for stage in stages:
        for elapsed in decode_steps(steps, stage.windows).values():
            if len(elapsed) < LEAST:
                continue
            groups += 1
            mean = statistics.fmean(elapsed)
            diffs.extend(e - mean for e in elapsed)
    if len(diffs) < points:
        return StepSpread((), len(diffs), groups)
    diffs.sort()
    n = len(diffs)
    shares = [statistics.fmean(diffs[i * n // points : (i + 1) * n // points]) for i in range(points)]
    # Shares differ by one step at most when n is not a multiple of points: recentre to mean 0 exactly.
    shift = statistics.fmean(shares)
    return StepSpread(tuple(round(v - shift, DIGITS) for v in shares), n, groups)
