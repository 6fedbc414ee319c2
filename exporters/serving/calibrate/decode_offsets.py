"""The decode step by batch where the engine departs from the fitted formula, from vLLM's own step log, for the
profile's ``decode_step_offsets_seconds`` (docs/calibration.md, *The decode step by batch*).

The fitted formula is smooth in the batch (a fixed cost, a plateau while the weights' read dominates, then a
slope), and a real engine's step need not be: vLLM on a GPU pads a decode batch to its next CUDA graph size (a
staircase); the CPU build's step at 3 and 4 sequences ran 5-13 % below the formula fitted over 1 to 8, and at
2 above it, the same way on every sweep. For each batch with at least ``LEAST`` decode-only steps logged in
one fitted stage's runs, the offset is the logged mean less the fit's prediction for that stage's row, averaged
over those stages weighted by their steps. The fit's log rows are these same means, so the offsets are its
residuals at the log rows, pooled by batch; the held-out stages give none. Batches between two measured ones
take the straight line between their offsets; below the first measured and past the last, none.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from exporters.serving.calibrate.fit import FitResult
from exporters.serving.calibrate.iteration_log import LEAST, LoggedStep, decode_row, decode_steps
from exporters.serving.calibrate.observations import Stage
from loadlens.contracts.model_profile import ModelProfile

DIGITS = 7
"""Decimals of a second each offset is written with."""


@dataclass(frozen=True, slots=True)
class DecodeOffsets:
    values: tuple[float, ...]
    """Seconds for batch 1, 2, ...: the profile's list (empty when no batch had ``LEAST`` steps in a stage)."""
    measured: dict[int, int]
    """Decode-only steps behind each measured batch's offset (the other items are interpolated or 0)."""

    def note(self) -> str:
        if not self.values:
            return f"none: no batch with {LEAST} decode-only steps in one fitted stage"
        parts = [f"b{b} {self.values[b - 1] * 1000:+.2f}" + ("" if b in self.measured else " (between)")
                 for b in range(1, len(self.values) + 1)]  # fmt: skip
        steps = sum(self.measured.values())
        return (f"ms against the fitted step, {steps} decode-only steps: {', '.join(parts)}; the sim adds each to "
                f"its decode-only steps of that batch")  # fmt: skip

    def as_dict(self) -> dict[str, object]:
        """``--json``'s ``decode_step_offsets``: the values and the steps behind each measured batch."""
        return {"values": list(self.values), "steps": {str(b): n for b, n in sorted(self.measured.items())}}


def measure(model: ModelProfile, fit: FitResult, stages: Sequence[Stage], steps: Sequence[LoggedStep]) -> DecodeOffsets:
    """Each batch's logged decode-only steps in ``stages`` against the fit's step for them."""
    weighted: dict[int, float] = {}
    counts: dict[int, int] = {}
    for stage in stages:
        for batch, elapsed in decode_steps(steps, stage.windows).items():
            if len(elapsed) < LEAST:
                continue
            residual = statistics.fmean(elapsed) - fit.predict(decode_row(model, stage, batch))
            weighted[batch] = weighted.get(batch, 0.0) + len(elapsed) * residual
            counts[batch] = counts.get(batch, 0) + len(elapsed)
    if not counts:
        return DecodeOffsets((), {})
    offsets = {b: weighted[b] / counts[b] for b in counts}
    known = sorted(offsets)
    values = []
    for b in range(1, known[-1] + 1):
        if b in offsets:
            values.append(offsets[b])
        elif b < known[0]:
            values.append(0.0)
        else:
            lo = max(k for k in known if k < b)
            hi = min(k for k in known if k > b)
            values.append(offsets[lo] + (offsets[hi] - offsets[lo]) * (b - lo) / (hi - lo))
    return DecodeOffsets(tuple(round(v, DIGITS) for v in values), counts)
