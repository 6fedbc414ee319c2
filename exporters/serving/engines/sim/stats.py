"""Plain records of what the engine did, and the :class:`StatLogger` interface that turns them into series.

The shape is vLLM V1's: the engine core fills a scheduler snapshot and per-iteration stats, and a stat logger
records them; the step loop itself never touches a metric. :class:`~.vllm_metrics.VllmMetrics` is the
Prometheus logger; the engine knows only this module. The sim hands a step over in two records because it
knows a step's plan (batch, cost, preemptions) before it sleeps and the sampled tokens only after: each is
recorded at the instant the loop learns it, so a scrape in the middle of a step sees what it always saw.
What the loop learns after a sleep (how late it woke, the step's tokens, the queue it leaves) comes as one
:class:`EngineStats`, since nothing can scrape between them; rarer events come one record each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

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
    """vLLM's MFU estimate of the step's FLOPs (``loadlens/contracts/mfu.py``); 0 without
    ``enable_mfu_metrics``."""
    read_bytes: float = 0.0
    """The same estimate's bytes read: weights once, layer inputs, the KV cache attended to."""
    write_bytes: float = 0.0
    """The same estimate's bytes written: layer outputs, the new tokens' K and V, logits."""
    busy_seconds: float = 0.0
    """Wall seconds of the step after its host overhead: the model's run, which vLLM's iteration log times."""
    counts: tuple[int, int, int, int] = (0, 0, 0, 0)
    """(context requests, their tokens, generation requests, their tokens), as vLLM's iteration log counts."""


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
    last_token_seen: float | None = None
    """When the API server would stamp the last token (``last_token`` plus the GPU profile's output part,
    docs/sim-engine.md §1, *Frontend*); E2E runs to it. None: ``last_token``."""


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


@dataclass(frozen=True, slots=True)
class WakeupStats:
    """How late the loop woke against a deadline (a step's end or an adapter read's)."""

    late_seconds: float
    """Wake-up minus deadline; negative when the timer fired early (loggers clamp it at 0)."""
    late_step: bool
    """Later than the sim's timing goal: a late step."""
    slipped: bool
    """So late that the loop restarted its schedule from now."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The engine's state each time it publishes it: after every step and adapter read, when the loop goes
    idle, and after a change outside the loop (adapter registered or removed, knobs, stop)."""

    scheduler: SchedulerStats
    lora: LoraStats | None
    """None while no adapter is registered or in use: the LoRA info then keeps its last value."""
    wakeup: WakeupStats | None = None
    """The deadline the loop just woke from (a step's or an adapter read's)."""
    iteration: IterationStats | None = None
    """What the step that just ended produced."""
    idle: bool = False
    """The loop is going idle: nothing is behind schedule any more."""


@dataclass(frozen=True, slots=True)
class AdapterRead:
    """An adapter read from storage into the host cache; the loop is blocked for it (recorded before it sleeps)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class BlockEviction:
    """A prefix-cached KV block evicted to make room (vLLM's KV-cache residency sample)."""

    lifetime: float
    """Seconds from entering the cache to eviction."""
    idle: float
    """Seconds since its last access."""
    reuse_gaps: Sequence[float]
    """Seconds between its consecutive kept accesses."""


RejectReason = Literal["max_num_queued_reqs", "max_num_queued_tokens"]


@dataclass(frozen=True, slots=True)
class Rejection:
    """A request refused at admission because a waiting-queue bound was reached."""

    reason: RejectReason


@dataclass(frozen=True, slots=True)
class EarlyEnd:
    """A request that ended before stop or length: aborted by its client or failed by the engine."""

    reason: FinishReason


@dataclass(frozen=True, slots=True)
class KnobChange:
    """Run-time knobs applied: what they did to the cache and the running requests."""

    num_preempted: int
    """Running requests preempted so that the blocks in use fit a smaller cache."""
    cache_info: Mapping[str, str]
    """The cache configuration now (``kv_sizing.cache_config_info``)."""


EngineEvent = AdapterRead | BlockEviction | Rejection | EarlyEnd | KnobChange
"""The records that come one at a time, outside the rhythm of steps."""


class StatLogger(Protocol):
    """Receives every record the engine produces, in order; what it makes of them is its own business."""

    def record_step(self, step: StepStats) -> None:
        """A planned step, before the loop sleeps through it."""

    def record(self, stats: EngineStats) -> None:
        """The engine's state, with what the loop learned since the last one."""

    def record_event(self, event: EngineEvent) -> None:
        """One sporadic event (an eviction may come in the middle of planning a step)."""


class StatLoggers:
    """Several loggers as one: each gets every record, in the order given."""

    def __init__(self, loggers: Sequence[StatLogger]) -> None:
        self.loggers = tuple(loggers)

    def record_step(self, step: StepStats) -> None:
        for logger in self.loggers:
            logger.record_step(step)

    def record(self, stats: EngineStats) -> None:
        for logger in self.loggers:
            logger.record(stats)

    def record_event(self, event: EngineEvent) -> None:
        for logger in self.loggers:
            logger.record_event(event)
