"""The vllm:* recorder: names, labels, buckets and per-request semantics, exactly as vLLM 0.33."""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporters.serving.engine import FinishReason
from exporters.serving.engines.sim import SimEngine
from exporters.serving.engines.sim.stats import (
    AdapterRead,
    BlockEviction,
    EarlyEnd,
    EngineStats,
    FinishedRequestStats,
    IterationStats,
    KnobChange,
    LoraStats,
    Rejection,
    SchedulerStats,
    StepStats,
    WakeupStats,
)
from exporters.serving.engines.sim.vllm_metrics import VllmMetrics
from loadlens.contracts.buckets import (
    VLLM_INTER_TOKEN_LATENCY,
    VLLM_KV_CACHE_RESIDENCY,
    VLLM_REQUEST_LATENCY,
    VLLM_TIME_TO_FIRST_TOKEN,
)

LAB = {"model_name": "m", "engine": "0"}
CACHE = {"block_size": "16", "num_gpu_blocks": "100"}


def make(*, enable_mfu_metrics: bool = False) -> tuple[VllmMetrics, CollectorRegistry]:
    reg = CollectorRegistry()
    metrics = VllmMetrics(
        reg, model_name="m", max_model_len=2048, cache_info=CACHE, max_loras=2, enable_mfu_metrics=enable_mfu_metrics
    )
    return metrics, reg


def bounds(reg: CollectorRegistry, name: str) -> list[str]:
    return [
        s.labels["le"]
        for metric in reg.collect()
        for s in metric.samples
        if s.name == f"{name}_bucket" and s.labels.get("engine") == "0"
    ]


def test_histogram_buckets_are_vllms() -> None:
    _, reg = make()
    assert bounds(reg, "vllm:time_to_first_token_seconds") == [*map(str, VLLM_TIME_TO_FIRST_TOKEN), "+Inf"]
    assert bounds(reg, "vllm:inter_token_latency_seconds") == [*map(str, VLLM_INTER_TOKEN_LATENCY), "+Inf"]
    assert bounds(reg, "vllm:request_time_per_output_token_seconds") == bounds(reg, "vllm:inter_token_latency_seconds")
    assert bounds(reg, "vllm:e2e_request_latency_seconds") == [*map(str, VLLM_REQUEST_LATENCY), "+Inf"]
    tokens = ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0", "2000.0", "+Inf"]
    assert bounds(reg, "vllm:request_prompt_tokens") == tokens
    assert bounds(reg, "vllm:request_prefill_kv_computed_tokens") == tokens
    assert bounds(reg, "vllm:request_params_n") == ["1.0", "2.0", "5.0", "10.0", "20.0", "+Inf"]
    assert bounds(reg, "vllm:iteration_tokens_total")[-2:] == ["16384.0", "+Inf"]


def test_exposed_names_and_label_sets() -> None:
    _, reg = make()
    text = generate_latest(reg).decode()
    for line in [
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 0.0',
        'vllm:num_preemptions_total{engine="0",model_name="m"} 0.0',
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 0.0',
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 0.0',
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0',
        "loadlens_sim_schedule_slips_total 0.0",
        "loadlens_sim_late_steps_total 0.0",
        "loadlens_sim_lag_seconds 0.0",
        'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0',
        'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} 0.0',
        'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} 0.0',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 0.0',
        'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 0.0',
    ]:
        assert line in text
    assert "# TYPE vllm:iteration_tokens_total histogram" in text
    assert "# TYPE vllm:kv_cache_usage_perc gauge" in text


def test_finished_request_observes_every_histogram_once() -> None:
    m, reg = make()
    m.finished(FinishedRequestStats(FinishReason.STOP, arrival=10.0, queued=10.5, scheduled=11.0, first_token=12.0,
                                    last_token=20.0, prompt_tokens=100, output_tokens=5, max_tokens=64,
                                    preemptions=2, computed_prompt_tokens=36))  # fmt: skip

    def total(name: str) -> float:
        value = reg.get_sample_value(name, LAB)
        assert value is not None
        return value

    assert reg.get_sample_value("vllm:request_success_total", {**LAB, "finished_reason": "stop"}) == 1
    assert total("vllm:e2e_request_latency_seconds_sum") == 10.0
    assert total("vllm:request_queue_time_seconds_sum") == 0.5
    assert total("vllm:request_prefill_time_seconds_sum") == 1.0
    assert total("vllm:request_decode_time_seconds_sum") == 8.0
    assert total("vllm:request_inference_time_seconds_sum") == 9.0
    assert total("vllm:request_time_per_output_token_seconds_sum") == pytest.approx((10.0 - 2.0) / 4)
    assert total("vllm:request_prompt_tokens_sum") == 100
    assert total("vllm:request_generation_tokens_sum") == 5
    assert total("vllm:request_max_num_generation_tokens_sum") == 5
    assert total("vllm:request_params_max_tokens_sum") == 64
    assert total("vllm:request_params_n_sum") == 1
    assert total("vllm:request_num_preemptions_sum") == 2
    assert total("vllm:request_prefill_kv_computed_tokens_sum") == 36
    assert total("vllm:time_to_first_token_seconds_count") == 0  # recorded at the first token, not here


def test_single_token_request_has_zero_tpot() -> None:
    m, reg = make()
    m.finished(FinishedRequestStats(FinishReason.LENGTH, arrival=0.0, queued=0.0, scheduled=0.0, first_token=1.0,
                                    last_token=1.0, prompt_tokens=1, output_tokens=1, max_tokens=1, preemptions=0,
                                    computed_prompt_tokens=1))  # fmt: skip
    assert reg.get_sample_value("vllm:request_time_per_output_token_seconds_sum", LAB) == 0.0
    assert reg.get_sample_value("vllm:request_time_per_output_token_seconds_count", LAB) == 1


def test_aborts_are_counted_but_observed_nowhere() -> None:
    m, reg = make()
    m.ended_early(FinishReason.ABORT)
    m.ended_early(FinishReason.ERROR)
    assert reg.get_sample_value("vllm:request_success_total", {**LAB, "finished_reason": "abort"}) == 1
    assert reg.get_sample_value("vllm:request_success_total", {**LAB, "finished_reason": "error"}) == 1
    assert reg.get_sample_value("vllm:e2e_request_latency_seconds_count", LAB) == 0


def test_queue_gauges_split_waiting_by_reason() -> None:
    m, reg = make()
    m.set_queue(running=3, waiting=7, deferred=2, kv_usage=0.25)
    assert reg.get_sample_value("vllm:num_requests_running", LAB) == 3
    assert reg.get_sample_value("vllm:num_requests_waiting", LAB) == 7
    assert reg.get_sample_value("vllm:num_requests_waiting_by_reason", {**LAB, "reason": "capacity"}) == 5
    assert reg.get_sample_value("vllm:num_requests_waiting_by_reason", {**LAB, "reason": "deferred"}) == 2
    assert reg.get_sample_value("vllm:kv_cache_usage_perc", LAB) == 0.25


def test_lora_info_keeps_only_the_current_label_set_with_wall_clock_value() -> None:
    m, reg = make()
    before = time.time()
    m.set_lora_info(2, ("b",), ("a", "c"))
    value = reg.get_sample_value(
        "vllm:lora_requests_info", {"max_lora": "2", "waiting_lora_adapters": "b", "running_lora_adapters": "a,c"}
    )
    assert value is not None and before <= value <= time.time()
    assert (
        reg.get_sample_value(
            "vllm:lora_requests_info", {"max_lora": "2", "waiting_lora_adapters": "", "running_lora_adapters": ""}
        )
        is None
    )


def test_cache_info_is_replaced_when_the_cache_changes() -> None:
    m, reg = make()
    m.set_cache_info({"block_size": "16", "num_gpu_blocks": "50"})
    assert reg.get_sample_value("vllm:cache_config_info", {"block_size": "16", "engine": "0",
                                                           "num_gpu_blocks": "50"}) == 1  # fmt: skip
    assert reg.get_sample_value("vllm:cache_config_info", {"block_size": "16", "engine": "0",
                                                           "num_gpu_blocks": "100"}) is None  # fmt: skip


# --- the stat-logger path: plain records in, series out ----------------------------------------------------


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    v = reg.get_sample_value(name, labels)
    assert v is not None, f"{name}{labels} is missing"
    return v


def test_step_record_feeds_the_step_series() -> None:
    m, reg = make()
    m.record_step(StepStats(0.004, 3, num_preempted=2, prefix_queries=48, prefix_hits=32,
                            adapter_loads=[("host", 0.02), ("storage", 0.5)]))  # fmt: skip
    m.record_step(StepStats(0.001, 1))
    assert value(reg, "vllm:num_preemptions_total", **LAB) == 2
    assert value(reg, "vllm:prefix_cache_queries_total", **LAB) == 48
    assert value(reg, "vllm:prefix_cache_hits_total", **LAB) == 32
    assert value(reg, "loadlens_sim_step_duration_seconds_count") == 2
    assert value(reg, "loadlens_sim_step_duration_seconds_sum") == 0.004 + 0.001
    assert value(reg, "loadlens_sim_batch_size_sum") == 4
    assert value(reg, "loadlens_sim_adapter_load_seconds_sum", source="host") == 0.02
    assert value(reg, "loadlens_sim_adapter_load_seconds_sum", source="storage") == 0.5
    assert value(reg, "loadlens_sim_adapter_load_seconds_count", source="storage") == 1


def test_iteration_record_feeds_token_latency_and_request_series() -> None:
    m, reg = make()
    done = FinishedRequestStats(FinishReason.LENGTH, arrival=0.0, queued=0.0, scheduled=1.0, first_token=2.0,
                                last_token=4.0, prompt_tokens=30, output_tokens=3, max_tokens=3, preemptions=1,
                                computed_prompt_tokens=14)  # fmt: skip
    m.record_iteration(IterationStats(num_generation_tokens=3, num_prompt_tokens=30, time_to_first_tokens=[0.25],
                                      inter_token_latencies=[0.5, 0.125], finished_requests=[done]))  # fmt: skip
    m.record_iteration(IterationStats())  # a prefill-only step: no tokens, still one iteration observed
    assert value(reg, "vllm:generation_tokens_total", **LAB) == 3
    assert value(reg, "vllm:prompt_tokens_total", **LAB) == 30
    assert value(reg, "vllm:time_to_first_token_seconds_sum", **LAB) == 0.25
    assert value(reg, "vllm:time_to_first_token_seconds_count", **LAB) == 1
    assert value(reg, "vllm:inter_token_latency_seconds_sum", **LAB) == 0.625
    assert value(reg, "vllm:inter_token_latency_seconds_count", **LAB) == 2
    assert value(reg, "vllm:iteration_tokens_total_count", **LAB) == 2
    assert value(reg, "vllm:iteration_tokens_total_sum", **LAB) == 33
    assert value(reg, "vllm:iteration_tokens_total_bucket", **LAB, le="1.0") == 1
    assert value(reg, "vllm:request_success_total", **LAB, finished_reason="length") == 1
    assert value(reg, "vllm:request_num_preemptions_sum", **LAB) == 1
    assert value(reg, "vllm:request_prefill_kv_computed_tokens_sum", **LAB) == 14
    assert value(reg, "vllm:request_time_per_output_token_seconds_sum", **LAB) == 1.0  # (4 - 2) / (3 - 1)


def test_scheduler_record_sets_queue_gauges_and_lora_info_only_when_given() -> None:
    m, reg = make()
    lora_labels = {"max_lora": "2", "waiting_lora_adapters": "", "running_lora_adapters": ""}
    seeded = value(reg, "vllm:lora_requests_info", **lora_labels)
    m.record_scheduler(SchedulerStats(num_running=2, num_waiting=5, num_deferred=1, kv_cache_usage=0.5), None)
    assert value(reg, "vllm:num_requests_running", **LAB) == 2
    assert value(reg, "vllm:num_requests_waiting_by_reason", **LAB, reason="capacity") == 4
    assert value(reg, "vllm:kv_cache_usage_perc", **LAB) == 0.5
    assert value(reg, "vllm:lora_requests_info", **lora_labels) == seeded  # None: the info series is left alone
    m.record_scheduler(SchedulerStats(1, 0, 0, 0.0), LoraStats(2, ("w",), ("a", "b")))
    assert reg.get_sample_value("vllm:lora_requests_info", lora_labels) is None
    assert value(reg, "vllm:lora_requests_info", max_lora="2", waiting_lora_adapters="w",
                 running_lora_adapters="a,b") >= seeded  # fmt: skip


def test_rejections_preemptions_and_wakeups() -> None:
    m, reg = make()
    m.record_rejection("max_num_queued_tokens")
    m.record_preemptions(0)
    m.record_preemptions(3)
    m.record_wakeup(-0.001, slipped=False)  # early wake-ups count as 0 lateness
    assert value(reg, "loadlens_sim_lag_seconds") == 0.0
    m.record_wakeup(0.5, slipped=True, late_step=True)
    assert value(reg, "loadlens_sim_lag_seconds") == 0.5
    assert value(reg, "loadlens_sim_late_steps_total") == 1
    # Seconds of lateness land in a finite bucket (the largest is 30 s).
    assert value(reg, "loadlens_sim_timing_error_seconds_bucket", le="0.25") == 1
    assert value(reg, "loadlens_sim_timing_error_seconds_bucket", le="0.5") == 2
    m.record_wakeup(4.0, slipped=True, late_step=True)
    assert value(reg, "loadlens_sim_timing_error_seconds_bucket", le="2.5") == 2
    assert value(reg, "loadlens_sim_timing_error_seconds_bucket", le="5.0") == 3
    assert value(reg, "loadlens_sim_timing_error_seconds_bucket", le="30.0") == 3
    m.set_lag(0.0)
    assert value(reg, "loadlens_sim_lag_seconds") == 0.0
    assert value(reg, "vllm:admission_rejections_total", model_name="m", reason="max_num_queued_tokens") == 1
    assert value(reg, "vllm:admission_rejections_total", model_name="m", reason="max_num_queued_reqs") == 0
    assert value(reg, "vllm:num_preemptions_total", **LAB) == 3
    assert value(reg, "loadlens_sim_timing_error_seconds_sum") == 4.5
    assert value(reg, "loadlens_sim_timing_error_seconds_count") == 3
    assert value(reg, "loadlens_sim_schedule_slips_total") == 2
    assert value(reg, "loadlens_sim_late_steps_total") == 2


def test_prompt_sources_and_mfu_estimates() -> None:
    m, reg = make(enable_mfu_metrics=True)
    m.record_iteration(IterationStats(num_generation_tokens=2, num_prompt_tokens=100, num_cached_prompt_tokens=64))
    m.record_iteration(IterationStats(num_generation_tokens=1, num_prompt_tokens=10))
    assert value(reg, "vllm:prompt_tokens_total", **LAB) == 110
    assert value(reg, "vllm:prompt_tokens_by_source_total", **LAB, source="local_compute") == 46
    assert value(reg, "vllm:prompt_tokens_by_source_total", **LAB, source="local_cache_hit") == 64
    assert value(reg, "vllm:prompt_tokens_by_source_total", **LAB, source="external_kv_transfer") == 0
    assert value(reg, "vllm:prompt_tokens_cached_total", **LAB) == 64
    assert value(reg, "vllm:prompt_tokens_cached_by_source_total", **LAB, source="device") == 64
    assert value(reg, "vllm:prompt_tokens_cached_by_source_total", **LAB, source="disk") == 0
    m.record_step(StepStats(0.01, 4, flops=3e12, read_bytes=2e9, write_bytes=1e6))
    m.record_step(StepStats(0.01, 4, flops=1e12, read_bytes=1e9, write_bytes=1e6))
    assert value(reg, "vllm:estimated_flops_per_gpu_total", **LAB) == 4e12
    assert value(reg, "vllm:estimated_read_bytes_per_gpu_total", **LAB) == 3e9
    assert value(reg, "vllm:estimated_write_bytes_per_gpu_total", **LAB) == 2e6


def test_mfu_counters_stay_0_without_enable_mfu_metrics() -> None:
    """vLLM 0.32 registers them always and counts only with --enable-mfu-metrics (the real vLLM rig without the
    flag exports the three families at 0: tests/vllm/test_metrics_fidelity.py)."""
    m, reg = make()
    m.record_step(StepStats(0.01, 4, flops=3e12, read_bytes=2e9, write_bytes=1e6))
    assert value(reg, "vllm:estimated_flops_per_gpu_total", **LAB) == 0
    assert value(reg, "vllm:estimated_read_bytes_per_gpu_total", **LAB) == 0
    assert value(reg, "vllm:estimated_write_bytes_per_gpu_total", **LAB) == 0


def test_kv_block_residency_histograms_use_vllms_buckets() -> None:
    m, reg = make()
    assert bounds(reg, "vllm:kv_block_lifetime_seconds") == [*(str(float(b)) for b in VLLM_KV_CACHE_RESIDENCY), "+Inf"]
    assert len(VLLM_KV_CACHE_RESIDENCY) == 21 and VLLM_KV_CACHE_RESIDENCY[-1] == 1800
    m.record_block_eviction(6.0, 5.0, [1.0, 0.004])
    assert value(reg, "vllm:kv_block_lifetime_seconds_sum", **LAB) == 6.0
    assert value(reg, "vllm:kv_block_idle_before_evict_seconds_bucket", **LAB, le="5.0") == 1
    assert value(reg, "vllm:kv_block_idle_before_evict_seconds_bucket", **LAB, le="2.0") == 0
    assert value(reg, "vllm:kv_block_reuse_gap_seconds_count", **LAB) == 2
    assert value(reg, "vllm:kv_block_reuse_gap_seconds_bucket", **LAB, le="0.005") == 1


def test_engine_stats_bundle_feeds_wakeup_iteration_and_queue_series() -> None:
    m, reg = make()
    queue = SchedulerStats(num_running=2, num_waiting=3, num_deferred=1, kv_cache_usage=0.25)
    m.record(EngineStats(queue, None, WakeupStats(0.5, late_step=True, slipped=True),
                         IterationStats(num_generation_tokens=2, inter_token_latencies=[0.5, 0.5])))  # fmt: skip
    assert value(reg, "loadlens_sim_lag_seconds") == 0.5
    assert value(reg, "loadlens_sim_late_steps_total") == 1
    assert value(reg, "loadlens_sim_schedule_slips_total") == 1
    assert value(reg, "loadlens_sim_timing_error_seconds_sum") == 0.5
    assert value(reg, "vllm:generation_tokens_total", **LAB) == 2
    assert value(reg, "vllm:inter_token_latency_seconds_count", **LAB) == 2
    assert value(reg, "vllm:iteration_tokens_total_count", **LAB) == 1
    assert value(reg, "vllm:num_requests_waiting_by_reason", **LAB, reason="capacity") == 2
    # A bare snapshot observes nothing; an idle one resets the lag.
    m.record(EngineStats(queue, None, WakeupStats(-0.001, late_step=False, slipped=False)))
    assert value(reg, "loadlens_sim_lag_seconds") == 0.0
    m.record(EngineStats(queue, LoraStats(2, (), ("a",))))
    assert value(reg, "vllm:iteration_tokens_total_count", **LAB) == 1
    assert value(reg, "loadlens_sim_timing_error_seconds_count") == 2
    assert value(reg, "vllm:lora_requests_info", max_lora="2", waiting_lora_adapters="",
                 running_lora_adapters="a") > 0  # fmt: skip
    m.record(EngineStats(queue, None, WakeupStats(0.25, late_step=True, slipped=False)))
    assert value(reg, "loadlens_sim_lag_seconds") == 0.25
    m.record(EngineStats(SchedulerStats(0, 0, 0, 0.0), None, idle=True))
    assert value(reg, "loadlens_sim_lag_seconds") == 0.0
    assert value(reg, "vllm:num_requests_running", **LAB) == 0


def test_events_feed_their_series() -> None:
    m, reg = make()
    m.record_event(BlockEviction(6.0, 5.0, [1.0, 0.004]))
    m.record_event(AdapterRead(0.5))
    m.record_event(Rejection("max_num_queued_reqs"))
    m.record_event(EarlyEnd(FinishReason.ABORT))
    m.record_event(KnobChange(3, {"block_size": "16", "num_gpu_blocks": "50"}))
    assert value(reg, "vllm:kv_block_lifetime_seconds_sum", **LAB) == 6.0
    assert value(reg, "vllm:kv_block_idle_before_evict_seconds_sum", **LAB) == 5.0
    assert value(reg, "vllm:kv_block_reuse_gap_seconds_count", **LAB) == 2
    assert value(reg, "loadlens_sim_adapter_load_seconds_sum", source="storage") == 0.5
    assert value(reg, "loadlens_sim_adapter_load_seconds_count", source="host") == 0
    assert value(reg, "vllm:admission_rejections_total", model_name="m", reason="max_num_queued_reqs") == 1
    assert value(reg, "vllm:request_success_total", **LAB, finished_reason="abort") == 1
    assert value(reg, "vllm:e2e_request_latency_seconds_count", **LAB) == 0
    assert value(reg, "vllm:num_preemptions_total", **LAB) == 3
    assert value(reg, "vllm:cache_config_info", block_size="16", engine="0", num_gpu_blocks="50") == 1
    assert reg.get_sample_value("vllm:cache_config_info", {"block_size": "16", "engine": "0",
                                                           "num_gpu_blocks": "100"}) is None  # fmt: skip


def test_mfu_counters_match_vllms_names_types_labels_and_gate() -> None:
    """Against what vLLM's own source registers (tests/fixtures/vllm_mfu_metrics.json, read in vLLM 0.32.0):
    the same names, counter type and labels, behind the same flag with the same default (off)."""
    fixture = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm_mfu_metrics.json").read_text())
    assert fixture["vllm_version"] == "0.32.0" and fixture["flag"] == "--enable-mfu-metrics"
    default = inspect.signature(SimEngine).parameters["enable_mfu_metrics"].default
    assert default is fixture["flag_default"] is False
    m, reg = make(enable_mfu_metrics=True)
    m.record_step(StepStats(0.01, 4, flops=3e12, read_bytes=2e9, write_bytes=1e6))
    families = {metric.name: metric for metric in reg.collect()}
    for want in fixture["metrics"]:
        family = families[want["name"].removesuffix("_total")]
        assert family.type == want["type"]
        assert [(s.name, sorted(s.labels)) for s in family.samples if not s.name.endswith("_created")] == [
            (want["name"], sorted(want["labelnames"]))
        ]
    assert sorted(n for n in families if n.startswith("vllm:estimated_")) == sorted(
        w["name"].removesuffix("_total") for w in fixture["metrics"]
    )
