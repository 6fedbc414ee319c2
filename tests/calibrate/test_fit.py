"""The fit on synthetic stages whose server means are exactly the step model's: exact recovery, and the
parameters the data cannot identify named with the reason (exercised through ``fit`` as calibrate runs it)."""

from __future__ import annotations

import pytest

from exporters.serving.calibrate.fit import PARAMS, FitResult, admission_groups, admissions, fit, stage_rows
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
    # Every start is reported; the kept one leaves no residual, so no other regime comes close.
    assert [label for label, _, _ in result.starts] == [
        "every step compute-bound", "decode-only steps memory-bound", "every step memory-bound"]  # fmt: skip
    assert min(r for _, r, _ in result.starts) == pytest.approx(0.0, abs=1e-9)
    assert result.close_regimes() == []


def test_another_regime_within_a_quarter_of_the_residual_is_named() -> None:
    result = FitResult(values={}, stderr={}, memory_bound_steps=5,
                       starts=[("a", 0.040, 0), ("b", 0.032, 5), ("c", 0.041, 18), ("d", 0.039, 5)])  # fmt: skip
    # a: another regime, 0.040 <= 1.25 x 0.032; c: above it; d: the kept regime itself
    assert result.close_regimes() == [("a", 0.040, 0)]


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


def mixed_groups(prompts_in_the_top_bucket: float) -> Stage:
    """The rig's 4-user stage (sweep q3r3, per run): 44 admitting steps of one 241-token prompt, 7 of two and
    25 of three or four (the 1,024 bucket holds both), between 2,101 decode-only steps."""
    counters = {
        "vllm:iteration_tokens_total_count": 2177.0,
        "vllm:request_prefill_time_seconds_count": 44 + 2 * 7 + prompts_in_the_top_bucket,
        "vllm:request_prefill_time_seconds_sum": 10.0,
        "vllm:inter_token_latency_seconds_count": 8000.0,
        "vllm:inter_token_latency_seconds_sum": 48.0,
        "vllm:request_inference_time_seconds_sum": 3.64 * 20.0,
        bucket_key("1.0"): 16.0,
        bucket_key("8.0"): 2101.0,
        bucket_key("256.0"): 2145.0,
        bucket_key("512.0"): 2152.0,
        bucket_key("1024.0"): 2177.0,
        bucket_key("+Inf"): 2177.0,
    }
    return Stage("c4-p128", 4, 241.0, 64.0, 20.0, 130, {}, counters)


def test_groups_of_several_sizes_are_read_from_the_buckets() -> None:
    """Each bucket names the group size whose tokens fit in it; the 1,024 bucket (three or four prompts) takes
    the prompts the others leave, within three to four."""
    assert admission_groups(mixed_groups(75.0)) == (2177.0, [(1.0, 44.0), (2.0, 7.0), (3.0, 25.0)])
    assert admission_groups(mixed_groups(85.0)) == (2177.0, [(1.0, 44.0), (2.0, 7.0), (3.4, 25.0)])
    assert admission_groups(mixed_groups(125.0))[1][2] == (4.0, 25.0)  # more than four a step: held at four
    assert admissions(mixed_groups(75.0)) == (133.0 / 2177.0, 133.0 / 76.0)


def test_the_prefill_mean_weights_each_group_by_its_prompts() -> None:
    """A request's prefill is its group's step: 44 requests waited one 1-prompt step, 14 a 2-prompt step,
    75 a 3-prompt step; one mean group of 1.75 prompts would price them all alike."""
    rows = dict((name, row) for name, row, _ in stage_rows(model(), mixed_groups(75.0)))
    prefill = rows["mean prefill"]
    assert [(w, shape.seqs) for w, shape in prefill.parts] == [
        (44.0, pytest.approx(3.64)), (14.0, pytest.approx(3.64)), (75.0, pytest.approx(3.64))]  # fmt: skip
    weights = [44 * 2.64, 7 * 1.64, 25 * 0.64, 2101 * 3.64]  # decodes beside each group; the decode-only steps
    assert [w for w, _ in rows["mean ITL"].parts] == [pytest.approx(w) for w in weights]
    truth = FitResult(values=dict(TRUE), stderr=dict.fromkeys(TRUE, 0.0))
    one = truth.step(prefill.parts[0][1])
    three = truth.step(prefill.parts[2][1])
    assert truth.predict(prefill) == pytest.approx((44 * one + 14 * truth.step(prefill.parts[1][1]) + 75 * three) / 133)
