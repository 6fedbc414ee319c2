"""The fit on synthetic stages whose server means are exactly the step model's: exact recovery, and the
parameters the data cannot identify named with the reason (exercised through ``fit`` as calibrate runs it)."""

from __future__ import annotations

import pytest

from exporters.serving.calibrate.fit import PARAMS, FitResult, admissions, fit, stage_rows
from exporters.serving.calibrate.observations import Stage
from loadlens.contracts.engine_counters import bucket_key
from tests.calibrate.known import model

TRUE = {"step_overhead_s": 0.002, "per_seq_s": 1e-4, "s_per_flop": 3e-11, "s_per_byte": 2e-9, "insertion_s": 0.001}


def synthetic(name: str, users: int, prompt: float, running: float, params: dict[str, float],
              group: float = 1.0) -> Stage:  # fmt: skip
    """A stage of 1,000 steps, 50 admissions in groups of ``group``, ``running`` requests on average, whose
    mean ITL and mean prefill are exactly the model's under ``params``."""
    steps, admitted, duration = 1000.0, 50.0, 10.0
    counters = {
        "vllm:iteration_tokens_total_count": steps,
        "vllm:request_prefill_time_seconds_count": admitted,
        "vllm:inter_token_latency_seconds_count": 1.0,
        "vllm:inter_token_latency_seconds_sum": 1.0,  # placeholders: replaced by the model's values below
        "vllm:request_prefill_time_seconds_sum": 1.0,
        "vllm:request_inference_time_seconds_sum": running * duration,
        bucket_key("256.0"): steps - admitted / group,
        bucket_key("+Inf"): steps,
    }
    stage = Stage(name, users, prompt, 48.0, duration, 50, {}, counters)
    truth = FitResult(values=dict(params), stderr=dict.fromkeys(params, 0.0))
    for observable, row, _ in stage_rows(model(), stage):
        value = truth.predict(row)
        key = "vllm:inter_token_latency_seconds" if observable == "mean ITL" else "vllm:request_prefill_time_seconds"
        counters[f"{key}_sum"] = value * counters[f"{key}_count"]
    return stage


def ladder(params: dict[str, float], same_running: bool = False) -> list[Stage]:
    out = []
    for users, prompt in ((1, 300), (2, 300), (4, 300), (8, 300), (2, 400), (2, 800), (4, 600)):
        running = 3.0 if same_running else users * 0.9
        out.append(synthetic(f"c{users}-p{prompt}", users, prompt, running, params))
    return out


def test_exact_data_recovers_every_parameter() -> None:
    result = fit(model(), ladder(TRUE))
    assert result.not_identified == {}
    for name in PARAMS:
        assert result.values[name] == pytest.approx(TRUE[name], rel=1e-6)
    assert all(f == pytest.approx(y, rel=1e-9) for _, _, y, f in result.rows)


def test_a_constant_column_is_not_identified() -> None:
    # Every stage runs 3 requests on average: the per-sequence column is 3 in every row, one with the
    # fixed step overhead (their sum is all the data says).
    result = fit(model(), ladder(TRUE, same_running=True))
    assert result.not_identified == {"per_seq_s": "its column is constant (3 in every row): one with step_overhead_s"}
    assert result.values["per_seq_s"] == 0.0
    assert result.values["step_overhead_s"] == pytest.approx(TRUE["step_overhead_s"] + 3 * TRUE["per_seq_s"], rel=1e-6)


def test_a_fixed_parameter_is_held_at_zero_and_said() -> None:
    params = {**TRUE, "s_per_byte": 0.0}
    result = fit(model(), ladder(params), fixed=["s_per_byte"])
    assert result.not_identified == {"s_per_byte": "held at 0 (--fix)"}
    for name in PARAMS:
        assert result.values[name] == pytest.approx(params[name], rel=1e-6, abs=1e-15)


def test_a_negative_parameter_is_dropped_and_the_rest_refitted() -> None:
    params = {**TRUE, "insertion_s": -0.0005}
    result = fit(model(), ladder(params))
    assert list(result.not_identified) == ["insertion_s"]
    assert result.not_identified["insertion_s"].startswith("fitted below zero (")
    assert result.values["insertion_s"] == 0.0


def test_a_negative_step_overhead_is_dropped_too() -> None:
    params = {**TRUE, "step_overhead_s": -0.0015}
    result = fit(model(), ladder(params))
    assert result.not_identified == {
        "step_overhead_s": "fitted below zero (-0.0015): set to 0",
        "insertion_s": "fitted below zero (-0.00152): set to 0",  # refitted without the step cost
    }
    assert result.values["step_overhead_s"] == 0.0
    assert all(v >= 0 for v in result.values.values())


def test_one_stage_has_two_rows_and_fits_one_parameter() -> None:
    """Two rows leave no residual for two or more parameters: they go, the last first, until one is left."""
    result = fit(model(), ladder(TRUE)[:1])
    assert [p for p in PARAMS if p not in result.not_identified] == ["step_overhead_s"]
    assert result.values["step_overhead_s"] > 0
    assert all(v >= 0 for v in result.values.values())
    assert result.not_identified == {
        "per_seq_s": "not determined by the data (2 rows for 2 parameters)",
        "s_per_flop": "not determined by the data (2 rows for 3 parameters)",
        "s_per_byte": "no step of the data is bound by this term (its column is 0)",  # the kept start's regime
        "insertion_s": "not determined by the data (2 rows for 4 parameters)",
    }


def test_admissions_per_step_and_per_admitting_step_from_the_buckets() -> None:
    grouped = synthetic("g", 8, 300, 7.0, TRUE, group=5.0)
    assert admissions(grouped) == (0.05, 5.0)
    # A prompt shorter than the bucket edge above the users: steps cannot be told apart, one per step assumed.
    short = synthetic("s", 8, 100, 7.0, TRUE, group=5.0)
    assert admissions(short) == (0.05, 1.0)
