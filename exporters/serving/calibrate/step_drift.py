"""Whether the server's engine kept its speed from stage to stage, from vLLM's own step log: each stage's
decode-only steps (held-out stages included: this reads them, it fits nothing to them) against the other fitted
stages' steps of the same batch, each measured as its ratio to the fit's step for its own stage and batch, so a
stage whose context makes its steps longer is not counted as drift (docs/calibration.md, *Step drift*).

A model of the engine predicts a held-out stage from the fitted ones; where the engine itself ran a batch's step
slower or faster in that stage than in the others (a host that changed speed, a step that depends on what else
the host was doing), the stage's ITL and throughput errors carry that much, whatever the model. Per stage:
the steps-weighted mean over its batches with ``LEAST`` steps of (its mean / the fit's step) over (the other
fitted stages' pooled mean / the fit's step), less 1.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from exporters.serving.calibrate.fit import FitResult
from exporters.serving.calibrate.iteration_log import LEAST, LoggedStep, decode_row, decode_steps
from exporters.serving.calibrate.observations import Stage
from loadlens.contracts.model_profile import ModelProfile

WARN = 0.10
"""A stage whose steps drifted more than this either way is warned about: the goal on a median. On the CPU rig's
six sweeps with the log most stages stayed within ±9 % (a 20 s stage's steps are not the same host twice)."""


@dataclass(frozen=True, slots=True)
class Drift:
    ratio: float
    """The stage's steps against the other fitted stages' at the same batches, less 1."""
    steps: int
    """The stage's decode-only steps compared."""
    held_out: bool


@dataclass(frozen=True, slots=True)
class StepDrift:
    stages: dict[str, Drift]

    def note(self) -> str:
        if not self.stages:
            return f"none: no stage with {LEAST} decode-only steps at a batch the other fitted stages ran as often"
        return ", ".join(f"{name} {d.ratio * 100:+.1f} %" + (" (held out)" if d.held_out else "")
                         for name, d in self.stages.items())  # fmt: skip

    def warnings(self) -> list[str]:
        return [
            f"stage {name}{' (held out)' if d.held_out else ''}: vLLM's logged decode steps in it ran "
            f"{d.ratio * 100:+.1f} % against the other fitted stages' of the same batch: the engine's speed changed "
            "between stages, and that stage's ITL and throughput errors carry as much whatever the model"
            for name, d in self.stages.items()
            if abs(d.ratio) > WARN
        ]

    def as_dict(self) -> dict[str, dict[str, object]]:
        return {name: {"ratio": d.ratio, "steps": d.steps, "held_out": d.held_out} for name, d in self.stages.items()}


def measure(
    model: ModelProfile, fit: FitResult, stages: Sequence[Stage], fitted: Sequence[Stage], steps: Sequence[LoggedStep]
) -> StepDrift:
    """Each of ``stages``' drift against the ``fitted`` stages other than itself."""
    fitted_names = {s.name for s in fitted}
    # (stage, batch) -> (steps, mean logged / fit's step)
    ratios: dict[str, dict[int, tuple[int, float]]] = {}
    for stage in stages:
        ratios[stage.name] = {
            batch: (len(elapsed), statistics.fmean(elapsed) / fit.predict(decode_row(model, stage, batch)))
            for batch, elapsed in decode_steps(steps, stage.windows).items()
            if len(elapsed) >= LEAST
        }
    out: dict[str, Drift] = {}
    for stage in stages:
        weighted = 0.0
        compared = 0
        for batch, (n, own) in ratios[stage.name].items():
            others = [ratios[o][batch] for o in ratios if o != stage.name and o in fitted_names and batch in ratios[o]]
            count = sum(k for k, _ in others)
            if count < LEAST:
                continue
            reference = sum(k * r for k, r in others) / count
            weighted += n * own / reference
            compared += n
        if compared:
            out[stage.name] = Drift(weighted / compared - 1, compared, stage.name not in fitted_names)
    return StepDrift(out)
