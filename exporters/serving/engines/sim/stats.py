"""Plain records of what the engine did; :class:`~.vllm_metrics.VllmMetrics` turns them into series.

The shape is vLLM V1's: the engine core fills a scheduler snapshot and per-iteration stats, and a stat logger
records them; the step loop itself never touches a metric. The sim has two per-step records because it knows
a step's plan (batch, cost, preemptions) before it sleeps and the sampled tokens only after: each is recorded
at the instant the loop learns it, so a scrape in the middle of a step sees what it always saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporters.serving.engine import FinishReason


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """The queue after a step (or an admission, abort or knob change)."""

    num_running: int
    num_waiting: int
    num_deferred: int
    """Waiting requests skipped for want of a LoRA slot (the rest wait for capacity)."""
    kv_cache_usage: float


@dataclass(frozen=True, slots=True)
class LoraStats:
    max_loras: int
    waiting_adapters: tuple[str, ...]
    """Sorted names, as the ``vllm:lora_requests_info`` label joins them."""
    running_adapters: tuple[str, ...]


@dataclass(slots=True)
class StepStats:
    """A planned step, known before it runs. Durations are wall seconds (modeled / speed)."""

    duration_seconds: float
    num_seqs: int
    num_preempted: int = 0
    prefix_queries: int = 0
    """Prompt tokens looked up in the prefix cache by requests scheduled for the first time."""
    prefix_hits: int = 0
    adapter_loads: list[tuple[str, float]] = field(default_factory=list)
    """(source, wall seconds) of each GPU-slot activation: ``host`` or ``storage``."""
    flops: float = 0.0
    """The roofline's FLOPs for the step (vLLM's MFU estimate counts the same work)."""
    read_bytes: float = 0.0
    """Bytes the step reads from HBM: streamed weights and the KV cache attended to."""
    write_bytes: float = 0.0
    """Bytes the step writes to HBM: the KV of the tokens it computes."""


@dataclass(frozen=True, slots=True)
class FinishedRequestStats:
    """A request that finished normally (stop or length); instants on the ``time.monotonic()`` clock."""

    reason: FinishReason
    arrival: float
    queued: float
    scheduled: float
    first_token: float
    last_token: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    preemptions: int
    computed_prompt_tokens: int
    """Prompt tokens not served from the prefix cache."""


@dataclass(slots=True)
class IterationStats:
    """What one finished step produced."""

    num_generation_tokens: int = 0
    num_prompt_tokens: int = 0
    """Prompt tokens of the requests that got their first token in this step (vLLM counts them then)."""
    num_cached_prompt_tokens: int = 0
    """Of those, the ones served from the prefix cache (the rest were computed)."""
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
