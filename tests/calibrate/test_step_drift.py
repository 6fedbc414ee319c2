"""Step drift (exporters/serving/calibrate/step_drift.py): each stage's logged decode-only steps against the other
fitted stages' of the same batch, each as its ratio to the fit's step for its own stage, so that a held-out
stage's ITL error can be told apart from an engine that ran at another speed in it."""

from __future__ import annotations

import dataclasses

import pytest

from exporters.serving.calibrate.iteration_log import LEAST, LoggedStep, decode_row
from exporters.serving.calibrate.observations import Stage
from exporters.serving.calibrate.step_drift import Drift, StepDrift, measure
from tests.calibrate.known import model
from tests.calibrate.test_decode_offsets import FIT
from tests.calibrate.test_fit import TRUE, ladder


def _stages() -> list[Stage]:
    return [dataclasses.replace(s, windows=((1000.0 * i, 1000.0 * i + 20),)) for i, s in enumerate(ladder(TRUE)[:3])]


def _logged(stage: Stage, batch: int, ratio: float, n: int = LEAST) -> list[LoggedStep]:
    """``n`` decode-only steps of ``batch`` in ``stage``'s run, each ``ratio`` times the fit's step for them."""
    at = FIT.predict(decode_row(model(), stage, batch)) * ratio
    return [LoggedStep(stage.windows[0][0] + 1, 0, batch, at)] * n


def test_a_stage_whose_steps_ran_slower_than_the_others_at_the_same_batch_is_told() -> None:
    a, b, held = _stages()
    steps = _logged(a, 1, 1.08) + _logged(b, 1, 1.0, n=3 * LEAST) + _logged(held, 1, 1.2)
    steps += _logged(held, 2, 3.0)  # a batch no fitted stage ran: not compared
    steps += _logged(a, 3, 1.5, n=LEAST - 1)  # too few steps: not compared
    got = measure(model(), FIT, [a, b, held], [a, b], steps)
    reference = (1.08 + 3 * 1.0) / 4  # the fitted stages' steps pooled
    assert got.stages[held.name] == Drift(pytest.approx(1.2 / reference - 1), LEAST, True)  # type: ignore[arg-type]
    assert got.stages[a.name].ratio == pytest.approx(0.08)  # against b alone: a fitted stage is left out of its own
    assert got.stages[b.name].ratio == pytest.approx(1 / 1.08 - 1)
    assert [s.steps for s in got.stages.values()] == [LEAST, 3 * LEAST, LEAST]
    assert got.warnings() == [
        f"stage {held.name} (held out): vLLM's logged decode steps in it ran +{(1.2 / reference - 1) * 100:.1f} % "
        "against the other fitted stages' of the same batch: the engine's speed changed between stages, and that "
        "stage's ITL and throughput errors carry as much whatever the model"
    ]


def test_the_fits_step_takes_out_what_the_stage_itself_makes_longer() -> None:
    """Two stages of other prompt lengths whose steps are each the fit's for them: no drift, though their
    logged steps differ."""
    short, long = (dataclasses.replace(s, windows=((1000.0 * i, 1000.0 * i + 20),))
                   for i, s in enumerate(ladder(TRUE)[4:6]))  # fmt: skip
    assert (short.prompt_tokens, long.prompt_tokens) == (400, 800)
    steps = _logged(short, 2, 1.0) + _logged(long, 2, 1.0)
    assert steps[-1].elapsed_s > steps[0].elapsed_s * 1.01  # the longer context reads more KV
    got = measure(model(), FIT, [short, long], [short, long], steps)
    assert [d.ratio for d in got.stages.values()] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert got.warnings() == []


def test_no_comparable_steps_give_none() -> None:
    a, b, _ = _stages()
    got = measure(model(), FIT, [a, b], [a, b], _logged(a, 1, 1.0))
    assert got == StepDrift({})
    none = f"none: no stage with {LEAST} decode-only steps at a batch the other fitted stages ran as often"
    assert got.note() == none
    assert got.as_dict() == {}
    shown = StepDrift({"c1": Drift(0.012, 40, False), "c4": Drift(-0.153, 30, True)})
    assert shown.note() == "c1 +1.2 %, c4 -15.3 % (held out)"
    assert shown.as_dict() == {"c1": {"ratio": 0.012, "steps": 40, "held_out": False},
                               "c4": {"ratio": -0.153, "steps": 30, "held_out": True}}  # fmt: skip
