"""``calibrate --iteration-log``: vLLM's per-step log read into fit rows (exporters/serving/calibrate/
iteration_log.py): its lines, the steps inside each stage's runs, and a fit that recovers the step model and the
log's gap from exact rows."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from exporters.serving.calibrate.fit import LOG_GAP, PARAMS, FitResult, fit, mixed_step
from exporters.serving.calibrate.iteration_log import (
    LEAST,
    OBSERVABLE,
    LoggedStep,
    decode_steps,
    iteration_rows,
    parse,
    read_steps,
)
from exporters.serving.calibrate.observations import CalibrationInputError, Stage
from tests.calibrate.known import model
from tests.calibrate.test_fit import TRUE, ladder

# vLLM 0.32's line (CPU build, --enable-logging-iteration-details), as the rig's log holds it.
LINE = (
    "(APIServer pid=12821) INFO {stamp} [loggers.py:199] Engine 000: Iteration({i}): {c} context requests, "
    "{ct} context tokens, {g} generation requests, {g} generation tokens, iteration elapsed time: {ms} ms, CPU KV "
    "cache usage: 0.1%"
)


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))


def test_step_lines_are_read_with_their_second_in_this_hosts_zone() -> None:
    lines = [
        LINE.format(stamp="12-06 04:20:57", i=0, c=1, ct=240, g=0, ms="141.11"),
        "(APIServer pid=12821) INFO 12-06 04:20:58 [loggers.py:123] Avg prompt throughput: 10.0 tokens/s",
        LINE.format(stamp="12-06 04:20:58", i=1, c=0, ct=0, g=3, ms="8.62"),
    ]
    assert parse(lines, 2026) == [
        LoggedStep(_epoch("2026-12-06 04:20:57"), 1, 0, 0.14111),
        LoggedStep(_epoch("2026-12-06 04:20:58"), 0, 3, 0.00862),
    ]


def test_only_decode_only_steps_wholly_inside_a_run_count() -> None:
    t = 1_000_000.0
    steps = [
        LoggedStep(t - 1, 0, 1, 0.010),  # before the run
        LoggedStep(t, 0, 1, 0.011),  # its second starts with the run
        LoggedStep(t + 5, 1, 1, 0.120),  # a prefill beside a decode: not a decode step
        LoggedStep(t + 5, 0, 2, 0.012),
        LoggedStep(t + 9, 0, 2, 0.013),  # its second ends with the run
        LoggedStep(t + 9.5, 0, 2, 0.014),  # its second runs past the end
        LoggedStep(t + 30, 0, 2, 0.015),  # in the second run
    ]
    assert decode_steps(steps, [(t, t + 10), (t + 25, t + 35)]) == {1: [0.011], 2: [0.012, 0.013, 0.015]}


def _logged(truth: FitResult, stages: Sequence[Stage], gap: float) -> list[LoggedStep]:
    """LEAST decode-only steps per batch 1..users for each stage, each its model step less ``gap``, inside the
    stage's run."""
    out = []
    for stage in stages:
        start, _ = stage.windows[0]
        context = stage.prompt_tokens + (stage.output_tokens - 1) / 2
        for batch in range(1, stage.users + 1):
            step = truth.step(mixed_step(model(), float(batch), 0.0, stage.prompt_tokens, context)) - gap
            out += [LoggedStep(start + 1, 0, batch, step)] * LEAST
    return out


def test_exact_logged_rows_recover_the_step_model_and_the_logs_gap() -> None:
    stages = [dataclasses.replace(s, windows=((1000.0 * i, 1000.0 * i + 20),)) for i, s in enumerate(ladder(TRUE))]
    truth = FitResult(values=dict(TRUE), stderr=dict.fromkeys(TRUE, 0.0))
    gap = 0.0015
    steps = _logged(truth, stages, gap)
    rows = iteration_rows(model(), stages, steps)
    # One row per stage and batch (1 to its users), each a step of that batch at the stage's mean context.
    assert [(name, obs) for name, obs, _, _ in rows] == [
        (s.name, f"{OBSERVABLE} b={b}") for s in stages for b in range(1, s.users + 1)
    ]
    result = fit(model(), stages, extra=rows)
    assert result.not_identified == {}
    for name in PARAMS:
        assert result.values[name] == pytest.approx(TRUE[name], rel=1e-6)
    assert result.values[LOG_GAP] == pytest.approx(gap, rel=1e-6)
    assert all(f == pytest.approx(y, rel=1e-9) for _, _, y, f in result.rows)
    # Without logged rows the fit has no gap parameter at all.
    assert LOG_GAP not in fit(model(), stages).values


def test_a_batch_with_too_few_steps_gives_no_row() -> None:
    stage = dataclasses.replace(ladder(TRUE)[0], windows=((0.0, 20.0),))
    steps = [LoggedStep(1.0, 0, 1, 0.01)] * LEAST + [LoggedStep(1.0, 0, 2, 0.02)] * (LEAST - 1)
    assert [obs for _, obs, _, _ in iteration_rows(model(), [stage], steps)] == [f"{OBSERVABLE} b=1"]


def test_unusable_logs_are_refused_in_one_line(tmp_path: Path) -> None:
    stage = dataclasses.replace(
        ladder(TRUE)[0], windows=((_epoch("2026-12-06 04:00:00"), _epoch("2026-12-06 04:00:20")),)
    )
    missing = tmp_path / "missing.log"
    with pytest.raises(CalibrationInputError, match=r"^--iteration-log .*missing.log: cannot read it \("):
        read_steps(str(missing), [stage])
    plain = tmp_path / "plain.log"
    plain.write_text("INFO 12-06 04:00:01 vLLM started without the flag\n")
    with pytest.raises(CalibrationInputError) as err:
        read_steps(str(plain), [stage])
    assert str(err.value) == (
        f"--iteration-log {plain}: no step lines (was vLLM started with --enable-logging-iteration-details?)"
    )
    other = tmp_path / "other.log"
    other.write_text(LINE.format(stamp="12-06 05:00:01", i=0, c=0, ct=0, g=1, ms="9.0") + "\n")
    with pytest.raises(CalibrationInputError) as err:
        iteration_rows(model(), [stage], read_steps(str(other), [stage]), str(other))
    assert str(err.value) == (
        f"--iteration-log {other}: none of its decode-only steps (12-06 05:00:01 to 12-06 05:00:01, read in this "
        "host's time zone) falls in the fitted stages' runs: another server's log, or its clock in another zone"
    )
    bare = dataclasses.replace(stage, windows=())
    with pytest.raises(CalibrationInputError, match="the runs carry no start and end times"):
        read_steps(str(other), [bare])
