"""vLLM's engine series and sglang's: for each vLLM series loadlens reads, the sglang series with the same
meaning, or why sglang has none. The one home of that mapping; the serving dashboard's sglang view
(loadlens/dashboards/engine.py) is built from it and docs/metrics.md shows it (a test keeps them equal).

sglang's names, types, labels and buckets were read from sgl-project/sglang
``python/sglang/srt/observability/metrics_collector.py`` and ``scheduler_metrics_mixin.py`` at commit
``44cedc2b9c7dd31d9acae4498ea4fa0d3665feed`` (the stages from ``req_time_stats.py`` at
``00ce49e05c17e08f643afab34f3cdcef14935ac0``); older releases kept the same core names in
``srt/metrics/collector.py``. sglang exports them only with ``--enable-metrics``, on its API port's
``/metrics``; scheduler series carry ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``,
``moe_ep_rank`` (and ``dp_rank``), tokenizer series ``model_name`` and ``engine_type``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Dialect = Literal["vllm", "sglang"]
DIALECTS: tuple[Dialect, ...] = ("vllm", "sglang")
SeriesKind = Literal["gauge", "counter", "histogram", "info"]


@dataclass(frozen=True)
class Counterpart:
    """The sglang series that says what a vLLM series says.

    ``matchers`` select the same fact inside a broader family (a stage of the per-stage histogram);
    ``labels`` are constant labels the vLLM series has and sglang's lacks, added to the query's result
    (``label_replace``) so legends and groupings read the same in both views.
    """

    name: str
    matchers: str = ""
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EngineSeries:
    vllm: str  # the exposed name (counters with _total)
    kind: SeriesKind
    meaning: str
    sglang: Counterpart | None
    # With a counterpart: how it differs. Without: why sglang has none, and what is nearest.
    note: str
    vllm_matchers: str = ""  # the part of the vLLM family this entry is about (finished_reason=...)


ENGINE_SERIES: tuple[EngineSeries, ...] = (
    EngineSeries(
        "vllm:num_requests_running",
        "gauge",
        "requests in the engine's running batch",
        Counterpart("sglang:num_running_reqs"),
        "exported by the scheduler of attention-TP rank 0 (one series per DP rank); with "
        "--enable-metrics-for-all-schedulers every TP rank reports the same batch, which a sum counts again",
    ),
    EngineSeries(
        "vllm:num_requests_waiting",
        "gauge",
        "requests waiting to be scheduled",
        Counterpart("sglang:num_queue_reqs"),
        "the scheduler's waiting queue; requests compiling a grammar and P/D-disaggregation queues are other "
        "gauges (sglang:num_grammar_queue_reqs, sglang:num_prefill_*_queue_reqs, sglang:num_decode_*_queue_reqs)",
    ),
    EngineSeries(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "waiting requests by reason (capacity, deferred for LoRA slots)",
        None,
        "sglang gives no reason for waiting; its grammar and P/D queues are separate queues, not reasons",
    ),
    EngineSeries(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "share of the KV cache in use (0-1)",
        Counterpart("sglang:token_usage"),
        "share of the KV pool's token slots in use (0-1); for hybrid SWA or Mamba models the fullest pool",
    ),
    EngineSeries(
        "vllm:iteration_tokens_total",
        "histogram",
        "tokens per engine step",
        None,
        "sglang has no per-step token histogram; sglang:realtime_tokens_total{mode} counts tokens processed "
        "(prefill_compute, prefill_cache, decode) but not per step",
    ),
    EngineSeries(
        "vllm:num_preemptions_total",
        "counter",
        "requests preempted for KV cache space (they recompute)",
        Counterpart("sglang:num_retracted_requests_total"),
        "sglang retracts running requests when the KV pool runs out (its preemption; they are recomputed). "
        "A recent counter: older releases export only the gauge sglang:num_retracted_reqs (retractions in the "
        "last log interval), and the panel stays empty there",
    ),
    EngineSeries(
        "vllm:request_queue_time_seconds",
        "histogram",
        "queued until first scheduled",
        Counterpart("sglang:queue_time_seconds"),
        "wait-queue entry to first forward pass; sglang's buckets start 0, 0.1, 0.2, 0.5 s, so quantiles below "
        "100 ms are interpolated inside one bucket (the mean is exact)",
    ),
    EngineSeries(
        "vllm:request_prefill_time_seconds",
        "histogram",
        "first scheduled until first token",
        Counterpart("sglang:per_stage_req_latency_seconds", matchers='stage="prefill_forward"'),
        "the prefill_forward stage of sglang's per-stage histogram: first forward pass to prefill finished "
        "(buckets 1 ms x 1.62^k)",
    ),
    EngineSeries(
        "vllm:request_decode_time_seconds",
        "histogram",
        "first token until last token",
        None,
        "sglang measures no decode stage into its per-stage histogram (decode_forward and decode_loop are "
        "trace spans only); sglang:e2e_request_latency_seconds and sglang:time_to_first_token_seconds give "
        "its mean only, by difference",
    ),
    EngineSeries(
        "vllm:lora_requests_info",
        "info",
        "adapters of running and waiting requests (comma-joined names)",
        None,
        "sglang names no adapters of running or waiting requests; with --enable-lora it exports "
        "sglang:lora_pool_slots_used / _total and sglang:lora_pool_utilization, the adapters resident in "
        "GPU slots, a different fact",
    ),
    EngineSeries(
        "vllm:admission_rejections_total",
        "counter",
        "requests refused at admission (queue bounds, 429)",
        None,
        "sglang counts no refused requests; the proxy's loadlens_request_rejections_total still counts the "
        "refusals it answers",
    ),
    EngineSeries(
        "vllm:request_success_total",
        "counter",
        "requests that ended in abort or error",
        Counterpart("sglang:num_aborted_requests_total", labels=(("finished_reason", "abort"),)),
        "sglang counts aborted requests (by the client or the server) without a finish reason, so they show as "
        "abort; engine errors have no counter of their own",
        vllm_matchers='finished_reason=~"abort|error"',
    ),
    EngineSeries(
        "vllm:time_to_first_token_seconds",
        "histogram",
        "arrival until first token",
        Counterpart("sglang:time_to_first_token_seconds"),
        "measured by sglang's tokenizer process from request creation; buckets 0.1 s to 400 s",
    ),
    EngineSeries(
        "vllm:inter_token_latency_seconds",
        "histogram",
        "gap between output tokens",
        Counterpart("sglang:inter_token_latency_seconds"),
        "a chunk of n tokens is counted as n gaps of interval/n (vLLM: one sample per streamed event); "
        "buckets 2 ms to 8 s",
    ),
    EngineSeries(
        "vllm:e2e_request_latency_seconds",
        "histogram",
        "arrival until last token",
        Counterpart("sglang:e2e_request_latency_seconds"),
        "finished requests only; buckets 0.1 s to 2400 s",
    ),
    EngineSeries(
        "vllm:prompt_tokens_total",
        "counter",
        "prompt tokens processed",
        Counterpart("sglang:prompt_tokens_total"),
        "counted per finished request by the tokenizer process (vLLM: as prefill runs)",
    ),
    EngineSeries(
        "vllm:generation_tokens_total",
        "counter",
        "output tokens generated",
        Counterpart("sglang:generation_tokens_total"),
        "counted per finished request by the tokenizer process (vLLM: per step)",
    ),
)
BY_VLLM: dict[str, EngineSeries] = {s.vllm: s for s in ENGINE_SERIES}
