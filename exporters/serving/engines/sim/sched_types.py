"""The scheduler's data: requests, adapters, cache blocks, its limits and what one step plans."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from exporters.serving.engines.sim.roofline import BatchShape


class Policy(enum.StrEnum):
    FCFS = "fcfs"
    PRIORITY = "priority"


class Status(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(eq=False, slots=True)
class Adapter:
    """A registered LoRA adapter (what ``adapter_config.json`` says, sized for this model)."""

    name: str
    int_id: int
    path: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    params: int
    nbytes: int
    registered: bool = True


@dataclass(eq=False, slots=True)
class SchedRequest:
    request_id: str
    prompt_len: int
    priority: int = 0
    arrival: float = 0.0
    """When the request entered the engine (any clock, as long as ``schedule``'s cutoff uses the same)."""
    seq: int = 0
    """Arrival order; breaks priority ties and orders FCFS."""
    block_hashes: tuple[int, ...] = ()
    """Chained hashes of the full prompt blocks (empty without prefix caching)."""
    lora: Adapter | None = None
    images: int = 0
    image_start: int = 0
    """Index of the first image token (images follow the text)."""
    status: Status = Status.WAITING
    num_computed: int = 0
    num_output: int = 0
    blocks_held: int = 0
    cached_blocks: list[Block] = field(default_factory=list)
    """Leading blocks registered in (or reused from) the prefix cache; the rest of ``blocks_held`` are
    anonymous."""
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    scheduled_once: bool = False
    vision_done: bool = False

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output


@dataclass(eq=False, slots=True)
class Block:
    hash: int
    ref: int = 0
    born: float = 0.0
    """``time.monotonic()`` when the block entered the prefix cache (its allocation, for vLLM's residency)."""
    accesses: list[float] = field(default_factory=list)
    """The last few access instants (entering the cache, then prefix hits), oldest first."""


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    policy: Policy = Policy.FCFS
    max_loras: int = 1
    max_cpu_loras: int = 1


@dataclass(frozen=True, slots=True)
class AdapterLoad:
    adapter: Adapter
    from_disk: bool
    """The adapter was not in the host cache: it is read from storage too."""


@dataclass(slots=True)
class ScheduledBatch:
    reqs: list[SchedRequest]
    num_new: list[int]
    shape: BatchShape
    preempted: list[SchedRequest]
    newly_scheduled: list[SchedRequest]
    adapter_loads: list[AdapterLoad]
    adapter_evictions: list[Adapter]
    prefix_queries: int
    prefix_hits: int
    num_admitted: int = 0
    """Waiting requests (new or preempted) this step moved into the batch: it pays the insertion overhead."""

    def __bool__(self) -> bool:
        return bool(self.reqs)

    def iteration_counts(self) -> tuple[int, int, int, int]:
        """(context requests, their tokens, generation requests, their tokens), as vLLM's iteration log counts
        them (``compute_iteration_details``): a request is in its context phase until it has an output token."""
        ctx = ctx_tokens = 0
        for req, n in zip(self.reqs, self.num_new, strict=True):
            if req.num_output == 0:
                ctx += 1
                ctx_tokens += n
        return ctx, ctx_tokens, len(self.reqs) - ctx, sum(self.num_new) - ctx_tokens


@dataclass(frozen=True, slots=True)
class Reconfigured:
    """What :meth:`Scheduler.reconfigure` did that the caller must account for."""

    preempted: list[SchedRequest]
    """Running requests preempted so that the blocks in use fit a smaller cache."""
    evicted: list[Adapter]
    """Idle adapters that left their GPU slot (``max_loras`` dropped)."""
