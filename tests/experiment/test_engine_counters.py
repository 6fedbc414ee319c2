"""vLLM's engine counters as the calibration sweep records them: summed over label sets, buckets of
``iteration_tokens_total`` kept by edge, increases per measured window (loadlens/contracts/engine_counters.py)."""

from __future__ import annotations

from loadlens.contracts.engine_counters import (
    SPAN,
    bucket_counts,
    bucket_key,
    counter_increases,
    parse_engine_counters,
)

SCRAPE = """# HELP vllm:iteration_tokens_total Number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 2.0
vllm:iteration_tokens_total_bucket{engine="1",le="1.0",model_name="m"} 3.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 10.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 300.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.5
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 4.0
vllm:generation_tokens_total{engine="0",model_name="m"} 64.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""


def test_parse_keeps_the_engine_counters_summed_over_label_sets() -> None:
    assert parse_engine_counters(SCRAPE) == {
        bucket_key("1.0"): 5.0,
        bucket_key("+Inf"): 10.0,
        "vllm:iteration_tokens_total_count": 10.0,
        "vllm:iteration_tokens_total_sum": 300.0,
        "vllm:request_prefill_time_seconds_sum": 0.5,
        "vllm:generation_tokens_total": 64.0,
    }
    assert bucket_counts(parse_engine_counters(SCRAPE)) == [(1.0, 5.0), (float("inf"), 10.0)]


def test_increases_per_window_need_two_samples_inside_it() -> None:
    samples = [
        (1.0, {"a": 1.0}),
        (2.0, {"a": 3.0, "b": 1.0}),
        (3.0, {"a": 6.0, "b": 2.0}),
        (5.0, {"a": 10.0, "b": 5.0}),
        (6.0, {"a": 17.0, "b": 9.0}),
    ]
    # Window 1: 1..3 (a: 6 - 1; b absent from the first sample); window 2: 5..6 (a: 7, b: 4); window 3 has one.
    assert counter_increases(samples, [(1.0, 3.0), (5.0, 6.0), (2.5, 4.0)]) == {"a": 12.0, "b": 4.0, SPAN: 3.0}
