"""The decode step by batch from vLLM's log (exporters/serving/calibrate/decode_offsets.py): each batch's logged
decode-only steps against the fit, pooled over the fitted stages by their steps, interpolated between measured
batches, written to the profile; and a hidden sim's offsets recovered from the step log it writes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters.serving.calibrate.decode_offsets import DecodeOffsets, measure
from exporters.serving.calibrate.fit import LOG_GAP, FitResult
from exporters.serving.calibrate.frontend_fit import FrontendFit
from exporters.serving.calibrate.iteration_log import LEAST, LoggedStep, decode_row
from exporters.serving.calibrate.observations import Stage
from exporters.serving.calibrate.profile_out import write_profile
from loadlens.contracts.gpu_profile import GPUProfile, load_gpu_profile
from tests.calibrate.known import HIDDEN, HIDDEN_FRONTEND, logged_stages, model
from tests.calibrate.test_fit import TRUE, ladder

FIT = FitResult(values={**HIDDEN, LOG_GAP: 0.0005}, stderr=dict.fromkeys(HIDDEN, 0.0))


def _stages() -> list[Stage]:
    return [dataclasses.replace(s, windows=((1000.0 * i, 1000.0 * i + 20),)) for i, s in enumerate(ladder(TRUE)[:2])]


def _logged(stage: Stage, batch: int, offset: float, n: int = LEAST) -> list[LoggedStep]:
    """``n`` decode-only steps of ``batch`` in ``stage``'s run, each ``offset`` off the fit's step for them."""
    at = FIT.predict(decode_row(model(), stage, batch)) + offset
    return [LoggedStep(stage.windows[0][0] + 1, 0, batch, at)] * n


def test_each_batchs_offset_is_its_steps_against_the_fit_pooled_over_stages_by_their_steps() -> None:
    first, second = _stages()
    steps = _logged(first, 1, 0.001) + _logged(second, 1, 0.004, n=3 * LEAST)  # pooled: (1 + 3·4) / 4 ms
    steps += _logged(first, 2, 0.002) + _logged(second, 4, -0.001)  # batch 3 between 2 and 4
    # Left out: a batch of too few steps in its stage, a step with a prefill, a step outside every run.
    steps += _logged(first, 5, 0.05, n=LEAST - 1)
    steps += [LoggedStep(first.windows[0][0] + 2, 1, 1, 0.3), LoggedStep(5000.0, 0, 1, 0.9)]
    got = measure(model(), FIT, [first, second], steps)
    assert got.values == pytest.approx((0.00325, 0.002, 0.0005, -0.001), abs=1e-9)
    assert got.measured == {1: 4 * LEAST, 2: LEAST, 4: LEAST}
    assert all(round(v, 7) == v for v in got.values)


def test_batches_below_the_first_measured_take_none_and_no_measured_batch_gives_no_list() -> None:
    (stage,) = _stages()[:1]
    got = measure(model(), FIT, [stage], _logged(stage, 3, 0.002))
    assert got.values == pytest.approx((0.0, 0.0, 0.002), abs=1e-9)
    none = measure(model(), FIT, [stage], _logged(stage, 3, 0.002, n=LEAST - 1))
    assert none == DecodeOffsets((), {})
    assert none.note() == f"none: no batch with {LEAST} decode-only steps in one fitted stage"


def test_the_note_marks_the_interpolated_batches() -> None:
    note = DecodeOffsets((0.0001, -0.0003, -0.0007), {1: 500, 3: 40}).note()
    assert note == ("ms against the fitted step, 540 decode-only steps: b1 +0.10, b2 -0.30 (between), b3 -0.70; "
                    "the sim adds each to its decode-only steps of that batch")  # fmt: skip


def _profile(tmp: Path, name: str, offsets: tuple[float, ...], base: str = "h100-sxm", **values: float) -> GPUProfile:
    fit = FitResult(values={**HIDDEN, **values}, stderr=dict.fromkeys(HIDDEN, 0.0))
    front = FrontendFit(dict(HIDDEN_FRONTEND), dict.fromkeys(HIDDEN_FRONTEND, 0.0))
    return write_profile(fit, load_gpu_profile(base), tmp / f"{name}.yaml", name, "test", frontend=front,
                         decode_offsets=offsets)  # fmt: skip


def test_the_profile_carries_the_measured_offsets_and_never_the_bases(tmp_path: Path) -> None:
    measured = _profile(tmp_path, "offsets", (0.0, 0.0006, -0.0004))
    assert measured.decode_step_offsets_seconds == (0.0, 0.0006, -0.0004)
    assert _profile(tmp_path, "plain", (), base=measured.path).decode_step_offsets_seconds == ()


HIDDEN_OFFSETS = (0.0, 0.0006, -0.0004)
"""A hidden engine's decode step by batch off its formula: batch 2 0.6 ms slower, batch 3 0.4 ms faster."""


def test_a_hidden_sims_offsets_are_recovered_from_the_step_log_it_writes(tmp_path: Path) -> None:
    """The sim writes vLLM's iteration line for each step; the offsets measured from three stages' decode-only
    steps against the hidden formula are the hidden ones within 0.03 ms. The log times a step's run, without its
    host overhead: with no cost per sequence that overhead is the fixed step cost, the fit's ``log_gap_s``."""
    values = {"per_seq_s": 0.0, "s_per_byte": 1e-9}  # a decode's run of 1 ms and more: -0.4 ms never clamps
    gpu = _profile(tmp_path, "hidden-offsets", HIDDEN_OFFSETS, per_seq_s=0.0, s_per_byte=1e-9)
    stages, steps = logged_stages(gpu, ["c1-p240", "c3-p240", "p40-c2"])
    fit = FitResult(values={**HIDDEN, **values, LOG_GAP: HIDDEN["step_overhead_s"]}, stderr={})
    got = measure(model(), fit, stages, steps)
    assert set(got.measured) == {1, 2, 3}
    assert got.values == pytest.approx(HIDDEN_OFFSETS, abs=3e-5)
