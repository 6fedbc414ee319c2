"""The sim's Prometheus stat logger: the ``vllm:*`` series exactly as vLLM 0.33 names, labels and buckets them,
plus the sim's own ``loadlens_sim_*`` series, recorded from the engine's records (:mod:`.stats`). One object per
engine, on the registry it is given; every labelled child is bound once at start-up and gauges start at 0, so
dashboards see every series from the first scrape.

Semantics (vLLM docs/design/metrics.md): TTFT and e2e from the request's arrival at the HTTP layer to when the
API server would see the first and last token (the step's end plus the GPU profile's output part: the
frontend stage, docs/sim-engine.md §1); queue = scheduled - queued; prefill = first token - scheduled; decode =
last token - first token; inference = last token - scheduled (engine stamps); ITL one sample per output step
(engine stamps); TPOT = decode/(n - 1), 0 when n <= 1. Prompt tokens are
counted when the request's first token is produced, like vLLM's iteration stats.

Prompt tokens by source: ``local_compute`` + ``local_cache_hit`` (+ ``external_kv_transfer``, always 0: no KV
connector) = ``prompt_tokens``; ``prompt_tokens_cached`` = the cache hits, all from the GPU prefix cache
(``prompt_tokens_cached_by_source{source="device"}``). ``external_prefix_cache_*`` and ``mm_cache_*`` exist
and stay 0, as on a vLLM without a KV connector serving a text-only model. The MFU counters
(``estimated_*_per_gpu``) exist always and count only with ``enable_mfu_metrics`` (vLLM's
``--enable-mfu-metrics``; 0 otherwise, as in vLLM 0.32), vLLM's estimate of each step (:func:`mfu_step`,
``loadlens/contracts/mfu.py``; the proxy counts the same per request). The
KV-block residency histograms (``kv_block_*``, opt-in in vLLM with ``--kv-cache-metrics``, sampling 1 % of
blocks) are always on and sample every prefix-cached block (see :mod:`.block_pool`).

Aborts are counted under ``request_success{finished_reason="abort"}`` (real vLLM leaves that at 0,
vllm-project/vllm#31503) and, as in vLLM, observed in no histogram.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import assert_never

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from exporters.serving.engine import FinishReason
from exporters.serving.engines.sim.sched_types import SchedRequest
from exporters.serving.engines.sim.stats import (
    AdapterRead,
    BlockEviction,
    EarlyEnd,
    EngineEvent,
    EngineStats,
    FinishedRequestStats,
    IterationStats,
    KnobChange,
    LoraStats,
    Rejection,
    SchedulerStats,
    StepStats,
)
from loadlens.contracts import mfu
from loadlens.contracts.buckets import (
    ENGINE_STEP_SECONDS,
    LORA_SWAP_BLOCKING,
    SIM_BATCH_SEQS,
    TIMING_ERROR_SECONDS,
    VLLM_INTER_TOKEN_LATENCY,
    VLLM_ITERATION_TOKENS,
    VLLM_KV_CACHE_RESIDENCY,
    VLLM_REQUEST_LATENCY,
    VLLM_REQUEST_NUM_PREEMPTIONS,
    VLLM_REQUEST_PARAMS_N,
    VLLM_TIME_TO_FIRST_TOKEN,
    build_1_2_5_buckets,
)

WAITING_REASONS: tuple[str, ...] = ("capacity", "deferred")
ADMISSION_REASONS: tuple[str, ...] = ("max_num_queued_reqs", "max_num_queued_tokens")
FINISHED_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")
SLEEP_STATES: tuple[str, ...] = ("awake", "weights_offloaded", "discard_all")
PROMPT_SOURCES: tuple[str, ...] = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES: tuple[str, ...] = ("device", "host", "p2p", "disk", "external_unspecified")


def mfu_step(shape: mfu.Shape, reqs: Sequence[SchedRequest], num_new: Sequence[int]) -> mfu.Estimate:
    """vLLM's MFU estimate of one step, its entries as vLLM's scheduler output makes them: a request computing
    ``n`` tokens after ``num_computed`` has context ``num_computed + n``; a first schedule or ``n > 1`` is a
    prefill."""
    work = mfu.Work(steps=1.0)
    for req, n in zip(reqs, num_new, strict=True):
        if n:
            work.add(n, req.num_computed + n, prefill=n > 1 or req.num_computed == 0)
    return mfu.estimate(shape, work)


class VllmMetrics:
    """The Prometheus :class:`~.stats.StatLogger` of the sim's engine series. Metric classes are attributes so
    tests may swap them."""

    _gauge_cls = Gauge
    _counter_cls = Counter
    _histogram_cls = Histogram

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        model_name: str,
        max_model_len: int,
        cache_info: Mapping[str, str],
        max_loras: int,
        engine: str = "0",
        enable_mfu_metrics: bool = False,
    ) -> None:
        self.registry = registry
        self.model_name = model_name
        base = ("model_name", "engine")
        values = (model_name, engine)
        self._engine = engine

        def gauge(name: str, doc: str) -> Gauge:
            g = self._gauge_cls(name, doc, base, registry=registry, multiprocess_mode="mostrecent").labels(*values)
            g.set(0)
            return g

        def counter(name: str, doc: str) -> Counter:
            return self._counter_cls(name, doc, base, registry=registry).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
            return self._histogram_cls(name, doc, base, registry=registry, buckets=buckets).labels(*values)

        self.running = gauge("vllm:num_requests_running", "Requests in the current model execution batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        by_reason = self._gauge_cls(
            "vllm:num_requests_waiting_by_reason",
            "Waiting requests by why they wait: capacity (no room) or deferred (LoRA slots).",
            (*base, "reason"),
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self.waiting_by_reason = {r: by_reason.labels(*values, r) for r in WAITING_REASONS}
        for child in self.waiting_by_reason.values():
            child.set(0)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage as a 0-1 ratio (1 = full).")
        sleep = self._gauge_cls(
            "vllm:engine_sleep_state",
            "Engine sleep state: 1 for the current state (awake, weights_offloaded, discard_all), 0 otherwise.",
            (*base, "sleep_state"),
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        for state in SLEEP_STATES:  # the sim has no sleep mode: always awake
            sleep.labels(*values, state).set(1 if state == "awake" else 0)

        self._cache_info_family = self._gauge_cls(
            "vllm:cache_config_info",
            "Cache configuration of the engine (value 1; the configuration is in the labels).",
            (*cache_info.keys(), "engine"),
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self._cache_info_labels: tuple[str, ...] = ()
        self.set_cache_info(cache_info)

        self._lora_info = self._gauge_cls(
            "vllm:lora_requests_info",
            "Running and waiting LoRA adapters; the value is the wall-clock time of the last update.",
            ("max_lora", "waiting_lora_adapters", "running_lora_adapters"),
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self._lora_labels: tuple[str, str, str] | None = None
        self.set_lora_info(max_loras, (), ())

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        by_source = self._counter_cls(
            "vllm:prompt_tokens_by_source",
            "Prompt tokens by where their KV came from: computed, local prefix cache, external KV transfer.",
            (*base, "source"),
            registry=registry,
        )
        self.prompt_by_source = {src: by_source.labels(*values, src) for src in PROMPT_SOURCES}
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Prompt tokens served from a cache (local + external)."
        )
        cached_by_source = self._counter_cls(
            "vllm:prompt_tokens_cached_by_source",
            "Cached prompt tokens by the cache tier that served them.",
            (*base, "source"),
            registry=registry,
        )
        self.prompt_cached_by_source = {src: cached_by_source.labels(*values, src) for src in CACHED_SOURCES}
        # vLLM 0.32 registers these always (PerfMetricsProm, v1/metrics/perf.py) and counts only with
        # --enable-mfu-metrics (the scheduler builds its perf stats only then): 0 otherwise.
        self.enable_mfu_metrics = enable_mfu_metrics
        self.mfu: tuple[Counter, Counter, Counter] = (
            counter(
                "vllm:estimated_flops_per_gpu",
                "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
            ),
            counter(
                "vllm:estimated_read_bytes_per_gpu",
                "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
            ),
            counter(
                "vllm:estimated_write_bytes_per_gpu",
                "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
            ),
        )
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens processed.")
        success = self._counter_cls(
            "vllm:request_success", "Finished requests by finish reason.", (*base, "finished_reason"), registry=registry
        )
        self.success = {r: success.labels(*values, r) for r in FINISHED_REASONS}
        self.preemptions = counter("vllm:num_preemptions", "Preemptions by the engine (recompute).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix-cache lookups, in tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.")
        # vLLM 0.32 registers these on every server; they move only with a KV connector (external prefix cache)
        # or a multi-modal model (its processor cache), neither of which the sim has: they stay at 0, as on a
        # real text-only server without a connector.
        self.external_prefix_queries = counter(
            "vllm:external_prefix_cache_queries", "External (KV connector) prefix-cache lookups, in tokens."
        )
        self.external_prefix_hits = counter(
            "vllm:external_prefix_cache_hits", "External (KV connector) prefix-cache hits, in tokens."
        )
        self.mm_cache_queries = counter("vllm:mm_cache_queries", "Multi-modal cache lookups, in items.")
        self.mm_cache_hits = counter("vllm:mm_cache_hits", "Multi-modal cache hits, in items.")
        rejections = self._counter_cls(
            "vllm:admission_rejections",
            "Requests refused at admission because a waiting-queue bound was reached.",
            ("model_name", "reason"),
            registry=registry,
        )
        self.rejections = {r: rejections.labels(model_name, r) for r in ADMISSION_REASONS}

        req_tokens = build_1_2_5_buckets(max_model_len)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token (arrival to first token).",
            VLLM_TIME_TO_FIRST_TOKEN,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Time between consecutive output steps.", VLLM_INTER_TOKEN_LATENCY
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Per request: (e2e - TTFT) / (output tokens - 1).",
            VLLM_INTER_TOKEN_LATENCY,
        )
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", VLLM_REQUEST_LATENCY)
        self.queue = histogram("vllm:request_queue_time_seconds", "Queued to first scheduled.", VLLM_REQUEST_LATENCY)
        self.inference = histogram(
            "vllm:request_inference_time_seconds", "First scheduled to last token.", VLLM_REQUEST_LATENCY
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds", "First scheduled to first token.", VLLM_REQUEST_LATENCY
        )
        self.decode = histogram("vllm:request_decode_time_seconds", "First token to last token.", VLLM_REQUEST_LATENCY)
        self.req_prompt = histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", req_tokens)
        self.req_generation = histogram("vllm:request_generation_tokens", "Output tokens per request.", req_tokens)
        self.req_max_generation = histogram(
            "vllm:request_max_num_generation_tokens", "Most output tokens of any sequence of a request.", req_tokens
        )
        self.req_max_tokens = histogram("vllm:request_params_max_tokens", "The max_tokens parameter.", req_tokens)
        self.req_n = histogram("vllm:request_params_n", "The n parameter.", VLLM_REQUEST_PARAMS_N)
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total", "Tokens per engine step (prompt + generation).", VLLM_ITERATION_TOKENS
        )
        self.req_preemptions = histogram(
            "vllm:request_num_preemptions", "Preemptions per finished request.", VLLM_REQUEST_NUM_PREEMPTIONS
        )
        self.req_prefill_kv = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Prompt tokens computed (not served from the prefix cache) per request.",
            req_tokens,
        )

        self.kv_block_lifetime = histogram(
            "vllm:kv_block_lifetime_seconds",
            "KV-cache block lifetime from entering the prefix cache to eviction (every cached block sampled).",
            VLLM_KV_CACHE_RESIDENCY,
        )
        self.kv_block_idle = histogram(
            "vllm:kv_block_idle_before_evict_seconds",
            "Time since an evicted KV-cache block's last access.",
            VLLM_KV_CACHE_RESIDENCY,
        )
        self.kv_block_reuse_gap = histogram(
            "vllm:kv_block_reuse_gap_seconds",
            "Gaps between consecutive accesses of an evicted KV-cache block (its last 4 accesses).",
            VLLM_KV_CACHE_RESIDENCY,
        )

        # Sim-internal series: no vllm: prefix, no labels.
        self.step_duration = self._histogram_cls(
            "loadlens_sim_step_duration_seconds",
            "Wall duration of one simulated engine step (modeled duration / speed).",
            registry=registry,
            buckets=ENGINE_STEP_SECONDS,
        )
        self.timing_error = self._histogram_cls(
            "loadlens_sim_timing_error_seconds",
            "Lateness of the simulator's wake-up against each step's deadline.",
            registry=registry,
            buckets=TIMING_ERROR_SECONDS,
        )
        self.batch_size = self._histogram_cls(
            "loadlens_sim_batch_size",
            "Sequences in one simulated engine step.",
            registry=registry,
            buckets=SIM_BATCH_SEQS,
        )
        self.slips = self._counter_cls(
            "loadlens_sim_schedule_slips",
            "Times the simulator fell so far behind its deadlines that it restarted its schedule from now.",
            registry=registry,
        )
        self.late_steps = self._counter_cls(
            "loadlens_sim_late_steps",
            "Steps (and adapter reads) whose wake-up came more than 2 ms after their deadline.",
            registry=registry,
        )
        self.lag = self._gauge_cls(
            "loadlens_sim_lag_seconds",
            "How far behind its schedule the simulator delivered its last step (0 when idle or on time).",
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self.adapter_load_seconds = self._histogram_cls(
            "loadlens_sim_adapter_load_seconds",
            "Wall time the step loop was blocked by one adapter load.",
            ("source",),
            registry=registry,
            buckets=LORA_SWAP_BLOCKING,
        )
        self.adapter_loads = {s: self.adapter_load_seconds.labels(s) for s in ("storage", "host")}

    # --- updates -------------------------------------------------------------------------------------------

    def set_cache_info(self, info: Mapping[str, str]) -> None:
        labels = (*info.values(), self._engine)
        if labels == self._cache_info_labels:
            return
        if self._cache_info_labels:
            self._cache_info_family.remove(*self._cache_info_labels)
        self._cache_info_family.labels(*labels).set(1)
        self._cache_info_labels = labels

    def set_lora_info(self, max_loras: int, waiting: tuple[str, ...], running: tuple[str, ...]) -> None:
        """vLLM creates one child per label combination and never removes old ones; the sim keeps only the
        current one so cardinality stays bounded (queries that take the newest value still work)."""
        labels = (str(max_loras), ",".join(waiting), ",".join(running))
        if labels != self._lora_labels:
            if self._lora_labels is not None:
                self._lora_info.remove(*self._lora_labels)
            self._lora_labels = labels
        self._lora_info.labels(*labels).set(time.time())

    def set_queue(self, running: int, waiting: int, deferred: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_by_reason["deferred"].set(deferred)
        self.waiting_by_reason["capacity"].set(waiting - deferred)
        self.kv_usage.set(kv_usage)

    def finished(self, f: FinishedRequestStats) -> None:
        """A request that finished normally (stop or length)."""
        self.success[f.reason.value].inc()
        e2e = f.last_token - f.arrival
        ttft = f.first_token - f.arrival
        # vLLM's E2E ends when its API server processes the last token; TPOT and the engine intervals use the
        # engine core's stamps (vllm/v1/metrics/stats.py).
        self.e2e.observe(e2e if f.last_token_seen is None else f.last_token_seen - f.arrival)
        self.queue.observe(f.scheduled - f.queued)
        self.prefill.observe(f.first_token - f.scheduled)
        self.decode.observe(f.last_token - f.first_token)
        self.inference.observe(f.last_token - f.scheduled)
        self.req_prompt.observe(f.prompt_tokens)
        self.req_generation.observe(f.output_tokens)
        self.req_max_generation.observe(f.output_tokens)
        self.req_max_tokens.observe(f.max_tokens)
        self.req_n.observe(1)
        self.tpot.observe((e2e - ttft) / (f.output_tokens - 1) if f.output_tokens > 1 else 0.0)
        self.req_preemptions.observe(f.preemptions)
        self.req_prefill_kv.observe(f.computed_prompt_tokens)

    def ended_early(self, reason: FinishReason) -> None:
        """An aborted or failed request: counted, in no histogram (as vLLM)."""
        self.success[reason.value].inc()

    # --- the stat logger: records from the engine ----------------------------------------------------------

    def record(self, stats: EngineStats) -> None:
        if stats.wakeup is not None:
            w = stats.wakeup
            self.record_wakeup(w.late_seconds, slipped=w.slipped, late_step=w.late_step)
        if stats.iteration is not None:
            self.record_iteration(stats.iteration)
        self.record_scheduler(stats.scheduler, stats.lora)
        if stats.idle:
            self.set_lag(0.0)

    def record_event(self, event: EngineEvent) -> None:
        match event:
            case BlockEviction():  # the frequent one first
                self.record_block_eviction(event.lifetime, event.idle, event.reuse_gaps)
            case AdapterRead():
                self.record_adapter_load("storage", event.seconds)
            case Rejection():
                self.record_rejection(event.reason)
            case EarlyEnd():
                self.ended_early(event.reason)
            case KnobChange():
                self.record_preemptions(event.num_preempted)
                self.set_cache_info(event.cache_info)
            case _:
                assert_never(event)

    def record_scheduler(self, stats: SchedulerStats, lora: LoraStats | None) -> None:
        """``lora`` is None while no adapter is registered or in use: the info series then keeps its value."""
        self.set_queue(stats.num_running, stats.num_waiting, stats.num_deferred, stats.kv_cache_usage)
        if lora is not None:
            self.set_lora_info(lora.max_loras, lora.waiting_adapters, lora.running_adapters)

    def record_step(self, step: StepStats) -> None:
        for source, seconds in step.adapter_loads:
            self.adapter_loads[source].observe(seconds)
        self.record_preemptions(step.num_preempted)
        if step.prefix_queries:
            self.prefix_queries.inc(step.prefix_queries)
            self.prefix_hits.inc(step.prefix_hits)
        self.step_duration.observe(step.duration_seconds)
        self.batch_size.observe(step.num_seqs)
        if self.enable_mfu_metrics:
            flops, read, written = self.mfu
            flops.inc(step.flops)
            read.inc(step.read_bytes)
            written.inc(step.write_bytes)

    def record_iteration(self, it: IterationStats) -> None:
        for seconds in it.time_to_first_tokens:
            self.ttft.observe(seconds)
        itl = self.itl.observe
        for seconds in it.inter_token_latencies:
            itl(seconds)
        for finished in it.finished_requests:
            self.finished(finished)
        self.generation_tokens.inc(it.num_generation_tokens)
        if it.num_prompt_tokens:
            cached = it.num_cached_prompt_tokens
            self.prompt_tokens.inc(it.num_prompt_tokens)
            self.prompt_by_source["local_compute"].inc(it.num_prompt_tokens - cached)
            if cached:
                self.prompt_by_source["local_cache_hit"].inc(cached)
                self.prompt_cached.inc(cached)
                self.prompt_cached_by_source["device"].inc(cached)
        # Observed for every step, also one that only ran prefill chunks (0 tokens), as before.
        self.iteration_tokens.observe(it.num_prompt_tokens + it.num_generation_tokens)

    def record_preemptions(self, n: int) -> None:
        if n:
            self.preemptions.inc(n)

    def record_block_eviction(self, lifetime: float, idle: float, gaps: Sequence[float]) -> None:
        """A prefix-cached KV block was evicted (vLLM's residency sample, taken at eviction)."""
        self.kv_block_lifetime.observe(lifetime)
        self.kv_block_idle.observe(idle)
        for gap in gaps:
            self.kv_block_reuse_gap.observe(gap)

    def record_rejection(self, reason: str) -> None:
        self.rejections[reason].inc()

    def record_adapter_load(self, source: str, seconds: float) -> None:
        self.adapter_loads[source].observe(seconds)

    def record_wakeup(self, late: float, *, slipped: bool, late_step: bool = False) -> None:
        """How late the loop woke against a deadline (clamped at 0), whether that makes a late step, and
        whether it restarted its schedule."""
        late = late if late > 0 else 0.0
        self.timing_error.observe(late)
        self.lag.set(late)
        if late_step:
            self.late_steps.inc()
        if slipped:
            self.slips.inc()

    def set_lag(self, seconds: float) -> None:
        self.lag.set(seconds)
