"""A vLLM-V1-like continuous-batching scheduler: synchronous and pure (no clock, no asyncio).

One call to :meth:`Scheduler.schedule` plans one engine step; :meth:`Scheduler.complete` applies its result.
Semantics follow vLLM V1's scheduler:

- Running requests go first, in order. Each gets the tokens it still needs (a prefill chunk, or one token when
  decoding) within the step's token budget (``max_num_batched_tokens``). When the KV cache has no free block
  for it, a running request is preempted by recompute - its blocks are freed, its progress reset, and it goes
  back to the front of the waiting queue: under ``fcfs`` the latest-arrived running request, under ``priority``
  the one with the largest (priority, arrival). If the victim is the request being scheduled, the running
  pass stops.
- Waiting requests are admitted only in a step without preemptions, in queue order (``fcfs``: arrival;
  ``priority``: lower value first, arrival breaks ties), while ``max_num_seqs`` and the budget allow. Without
  chunked prefill a prompt that does not fit the remaining budget stops admission. A waiting request that
  cannot get its blocks stops admission (waiting requests never preempt).
- LoRA: at most ``max_loras`` distinct adapters in a batch (the GPU slots). A waiting request whose adapter
  would be one too many is skipped - counted as ``deferred`` - and keeps its place. Admitting a request whose
  adapter is not in a GPU slot evicts the least recently used idle slot and reports a load, from the host
  cache or, after a CPU-cache miss (``max_cpu_loras``), from storage.
- KV cache: 16-token blocks allocated as sequences grow. With prefix caching, full prompt blocks are hashed
  (chained with the previous block's hash and the adapter name); a new request reuses the longest cached
  prefix (never its last token, which must be recomputed to sample). Freed cached blocks stay reusable until
  evicted, least recently freed first (a request's tail blocks before its head). Usage counts referenced
  blocks only, so it returns to 0 when the engine is idle, as vLLM's ``kv_cache_usage_perc`` does.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from exporters.serving.engines.sim.roofline import BLOCK_SIZE, BatchShape, LoraWork, attn_pairs


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
    owner: Any = None
    """The engine's per-request state; the scheduler never looks inside."""
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


class BlockPool:
    """Counts blocks rather than naming them: only prefix-cached blocks need an identity."""

    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.num_used = 0
        self._cached: dict[int, Block] = {}
        self._evictable: OrderedDict[int, Block] = OrderedDict()

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take: never used, or cached but unreferenced (evicted on demand)."""
        return self.num_blocks - self.num_used

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return self.num_used / self.num_blocks if self.num_blocks else 0.0

    def lookup(self, hashes: tuple[int, ...], max_blocks: int) -> list[Block]:
        hits: list[Block] = []
        if not self.enable_caching:
            return hits
        for h in hashes[:max_blocks]:
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def touch(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            if block.ref == 0:
                del self._evictable[block.hash]
                self.num_used += 1
            block.ref += 1

    def allocate(self, n: int) -> bool:
        if n > self.num_free:
            return False
        never_used = self.num_blocks - self.num_used - len(self._evictable)
        for _ in range(n - never_used):
            h, _block = self._evictable.popitem(last=False)
            del self._cached[h]
        self.num_used += n
        return True

    def promote(self, block_hash: int) -> Block | None:
        """Register one of a request's anonymous (already counted) blocks under ``block_hash``."""
        if not self.enable_caching or block_hash in self._cached:
            return None
        block = Block(block_hash, ref=1)
        self._cached[block_hash] = block
        return block

    def release(self, req: SchedRequest) -> None:
        self.num_used -= req.blocks_held - len(req.cached_blocks)
        # Tail first, so a request's last blocks are evicted before its shared head.
        for block in reversed(req.cached_blocks):
            block.ref -= 1
            if block.ref == 0:
                self.num_used -= 1
                self._evictable[block.hash] = block
        req.blocks_held = 0
        req.cached_blocks = []

    def resize(self, num_blocks: int) -> None:
        """Change the capacity; callers preempt first so that ``num_used`` fits."""
        if self.num_used > num_blocks:
            raise ValueError(f"{self.num_used} blocks in use do not fit in {num_blocks}")
        self.num_blocks = num_blocks
        while self.num_used + len(self._evictable) > num_blocks:
            h, _block = self._evictable.popitem(last=False)
            del self._cached[h]

    def reset_cache(self, enable: bool) -> None:
        """Forget unreferenced cached blocks (turning prefix caching off or on)."""
        for h in list(self._evictable):
            del self._cached[h]
        self._evictable.clear()
        self.enable_caching = enable


class WaitQueue:
    """FCFS deque or priority heap behind one interface."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._fifo: deque[SchedRequest] = deque()
        self._heap: list[tuple[int, int, SchedRequest]] = []

    def __len__(self) -> int:
        return len(self._heap) if self.policy is Policy.PRIORITY else len(self._fifo)

    def __iter__(self) -> Iterator[SchedRequest]:
        if self.policy is Policy.PRIORITY:
            return iter([entry[2] for entry in sorted(self._heap, key=lambda e: (e[0], e[1]))])
        return iter(self._fifo)

    def unordered(self) -> Iterator[SchedRequest]:
        """Every waiting request, cheaply, in no particular order."""
        if self.policy is Policy.PRIORITY:
            return (entry[2] for entry in self._heap)
        return iter(self._fifo)

    def add(self, req: SchedRequest) -> None:
        if self.policy is Policy.PRIORITY:
            heapq.heappush(self._heap, (req.priority, req.seq, req))
        else:
            self._fifo.append(req)

    def add_front(self, req: SchedRequest) -> None:
        """Preempted or skipped requests: FCFS puts them first; the heap orders them by key anyway."""
        if self.policy is Policy.PRIORITY:
            heapq.heappush(self._heap, (req.priority, req.seq, req))
        else:
            self._fifo.appendleft(req)

    def peek(self) -> SchedRequest:
        return self._heap[0][2] if self.policy is Policy.PRIORITY else self._fifo[0]

    def pop(self) -> SchedRequest:
        return heapq.heappop(self._heap)[2] if self.policy is Policy.PRIORITY else self._fifo.popleft()

    def remove(self, req: SchedRequest) -> None:
        if self.policy is Policy.PRIORITY:
            self._heap = [e for e in self._heap if e[2] is not req]
            heapq.heapify(self._heap)
        else:
            self._fifo.remove(req)


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

    def __bool__(self) -> bool:
        return bool(self.reqs)


class Scheduler:
    def __init__(self, config: SchedulerConfig, num_blocks: int, *, enable_prefix_caching: bool = True) -> None:
        self.config = config
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self.waiting = WaitQueue(config.policy)
        self.running: list[SchedRequest] = []
        self.gpu_adapters: OrderedDict[str, Adapter] = OrderedDict()
        self.cpu_adapters: OrderedDict[str, Adapter] = OrderedDict()
        self.num_deferred = 0
        self.waiting_tokens = 0
        """Prompt tokens of waiting requests (vLLM's ``max_num_queued_tokens`` bound)."""
        self._seq = 0

    # --- queue ---------------------------------------------------------------------------------------------

    def add(self, req: SchedRequest) -> None:
        req.seq = self._seq
        self._seq += 1
        req.status = Status.WAITING
        self.waiting.add(req)
        self.waiting_tokens += req.prompt_len

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def set_policy(self, policy: Policy) -> None:
        if policy is self.config.policy:
            return
        old = sorted(self.waiting, key=lambda r: r.seq)
        self.config.policy = policy
        self.waiting = WaitQueue(policy)
        for req in old:
            self.waiting.add(req)

    # --- the step ------------------------------------------------------------------------------------------

    def schedule(self, cutoff: float = math.inf) -> ScheduledBatch:
        """Plan one step that starts at time ``cutoff``: requests that arrived later wait for the next one."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: dict[SchedRequest, int] = {}
        preempted: list[SchedRequest] = []
        newly: list[SchedRequest] = []
        loads: list[AdapterLoad] = []
        evictions: list[Adapter] = []
        queries = hits_total = 0

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            ok = True
            while not self.pool.allocate(need := cdiv(req.num_computed + n, BLOCK_SIZE) - req.blocks_held):
                victim = self._victim()
                j = self.running.index(victim)
                del self.running[j]
                budget += scheduled.pop(victim, 0)
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    ok = False
                    break
                if j < i:
                    i -= 1
            if not ok:
                break
            req.blocks_held += need
            scheduled[req] = n
            budget -= n
            i += 1

        skipped: list[SchedRequest] = []
        future: list[SchedRequest] = []
        if not preempted:
            active = {r.lora.name for r in self.running if r.lora is not None}
            while len(self.waiting) and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self.waiting.peek()
                if req.arrival > cutoff:
                    if cfg.policy is Policy.FCFS:
                        break  # FCFS order is arrival order: everything behind arrived later still
                    future.append(self.waiting.pop())
                    continue
                lora = req.lora
                if lora is not None and lora.name not in active and len(active) >= cfg.max_loras:
                    skipped.append(self.waiting.pop())
                    continue
                hits = (
                    self.pool.lookup(req.block_hashes, (req.num_tokens - 1) // BLOCK_SIZE)
                    if req.num_computed == 0
                    else []
                )
                computed = len(hits) * BLOCK_SIZE
                n = req.num_tokens - computed
                if not cfg.enable_chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                need = cdiv(computed + n, BLOCK_SIZE) - len(hits)
                if need > self.pool.num_free - sum(1 for b in hits if b.ref == 0):
                    break
                self.waiting.pop()
                self.waiting_tokens -= req.prompt_len
                self.pool.touch(hits)
                self.pool.allocate(need)
                req.cached_blocks = hits
                req.blocks_held = len(hits) + need
                req.num_computed = computed
                if not req.scheduled_once:
                    req.scheduled_once = True
                    req.num_cached_tokens = computed
                    queries += req.num_tokens
                    hits_total += computed
                    newly.append(req)
                if lora is not None:
                    if lora.name not in self.gpu_adapters:
                        loads.append(self._activate(lora, active, evictions))
                    self.gpu_adapters.move_to_end(lora.name)
                    active.add(lora.name)
                req.status = Status.RUNNING
                self.running.append(req)
                scheduled[req] = n
                budget -= n
            for req in reversed(skipped + future):
                self.waiting.add_front(req)
        self.num_deferred = len(skipped)
        # Unloaded adapters leave their GPU slot as soon as nothing running uses them.
        in_use = {r.lora.name for r in self.running if r.lora is not None}
        for name in [n for n, a in self.gpu_adapters.items() if not a.registered and n not in in_use]:
            evictions.append(self.gpu_adapters.pop(name))

        reqs = list(scheduled)
        num_new = list(scheduled.values())
        return ScheduledBatch(
            reqs=reqs,
            num_new=num_new,
            shape=self._shape(reqs, num_new),
            preempted=preempted,
            newly_scheduled=newly,
            adapter_loads=loads,
            adapter_evictions=evictions,
            prefix_queries=queries,
            prefix_hits=hits_total,
        )

    def _shape(self, reqs: list[SchedRequest], num_new: list[int]) -> BatchShape:
        tokens = sampled = pairs = kv_read = images = 0
        lora_tokens: dict[str, int] = {}
        adapters: dict[str, Adapter] = {}
        for req, n in zip(reqs, num_new, strict=True):
            c = req.num_computed
            tokens += n
            kv_read += c
            if n == 1:
                pairs += c + 1
            else:
                pairs += attn_pairs(n, c)
            if c + n == req.num_tokens:
                sampled += 1
            if req.images and not req.vision_done and c + n > req.image_start:
                req.vision_done = True
                images += req.images
            if req.lora is not None:
                name = req.lora.name
                lora_tokens[name] = lora_tokens.get(name, 0) + n
                adapters[name] = req.lora
        work = tuple(
            LoraWork(params=a.params, modules_per_layer=len(a.target_modules), rank=a.rank, tokens=lora_tokens[name])
            for name, a in adapters.items()
        )
        return BatchShape(
            num_tokens=tokens,
            num_seqs=len(reqs),
            num_sampled=sampled,
            attn_pairs=pairs,
            kv_read_tokens=kv_read,
            images=images,
            lora=work,
        )

    def complete(self, batch: ScheduledBatch) -> list[SchedRequest]:
        """Apply a finished step; return the requests that sampled a token (``num_output`` already counts it).

        Requests aborted or preempted while the step ran are skipped: their blocks are already free.
        """
        sampled: list[SchedRequest] = []
        for req, n in zip(batch.reqs, batch.num_new, strict=True):
            if req.status is not Status.RUNNING:
                continue
            req.num_computed += n
            if req.block_hashes and len(req.cached_blocks) < len(req.block_hashes):
                self._promote(req)
            if req.num_computed == req.num_tokens:
                req.num_output += 1
                sampled.append(req)
        return sampled

    def _promote(self, req: SchedRequest) -> None:
        full = min(len(req.block_hashes), req.num_computed // BLOCK_SIZE)
        while len(req.cached_blocks) < full:
            block = self.pool.promote(req.block_hashes[len(req.cached_blocks)])
            if block is None:
                # Another request cached this block first; keep ours anonymous and stop (cached blocks lead).
                req.block_hashes = req.block_hashes[: len(req.cached_blocks)]
                return
            req.cached_blocks.append(block)

    # --- leaving -------------------------------------------------------------------------------------------

    def finish(self, reqs: Iterable[SchedRequest]) -> None:
        """Free finished running requests (one pass over ``running`` however many finish)."""
        any_finished = False
        for req in reqs:
            if req.status is Status.RUNNING:
                self.pool.release(req)
                req.status = Status.FINISHED
                any_finished = True
        if any_finished:
            self.running = [r for r in self.running if r.status is Status.RUNNING]

    def abort(self, req: SchedRequest) -> None:
        if req.status is Status.RUNNING:
            self.pool.release(req)
            self.running.remove(req)
        elif req.status in (Status.WAITING, Status.PREEMPTED):
            self.waiting.remove(req)
            self.waiting_tokens -= req.prompt_len
            self.pool.release(req)
        req.status = Status.FINISHED

    # --- preemption and resizing ---------------------------------------------------------------------------

    def _victim(self) -> SchedRequest:
        if self.config.policy is Policy.PRIORITY:
            return max(self.running, key=lambda r: (r.priority, r.seq))
        return self.running[-1]

    def _preempt(self, req: SchedRequest) -> None:
        self.pool.release(req)
        req.num_computed = 0
        req.num_preemptions += 1
        req.status = Status.PREEMPTED
        req.vision_done = False
        self.waiting.add_front(req)
        self.waiting_tokens += req.prompt_len

    def resize(self, num_blocks: int) -> list[SchedRequest]:
        """Set the KV-cache size. Shrinking below what is in use preempts running requests (policy order)."""
        preempted: list[SchedRequest] = []
        while self.pool.num_used > num_blocks and self.running:
            victim = self._victim()
            self.running.remove(victim)
            self._preempt(victim)
            preempted.append(victim)
        self.pool.resize(num_blocks)
        return preempted

    # --- adapters ------------------------------------------------------------------------------------------

    def cache_adapter(self, adapter: Adapter) -> list[Adapter]:
        """Put an adapter in the host (CPU) cache; returns what the LRU bound pushed out."""
        self.cpu_adapters[adapter.name] = adapter
        self.cpu_adapters.move_to_end(adapter.name)
        dropped: list[Adapter] = []
        while len(self.cpu_adapters) > self.config.max_cpu_loras:
            _, old = self.cpu_adapters.popitem(last=False)
            dropped.append(old)
        return dropped

    def forget_adapter(self, adapter: Adapter) -> list[Adapter]:
        """Unregister: leave the host cache now, the GPU slot once idle. Returns GPU slots freed now."""
        adapter.registered = False
        self.cpu_adapters.pop(adapter.name, None)
        in_use = any(r.lora is adapter for r in self.running) or any(
            r.lora is adapter for r in self.waiting.unordered()
        )
        if not in_use and self.gpu_adapters.get(adapter.name) is adapter:
            del self.gpu_adapters[adapter.name]
            return [adapter]
        return []

    def shrink_gpu_slots(self) -> list[Adapter]:
        """After ``max_loras`` drops: evict idle slots beyond the bound (LRU first)."""
        in_use = {r.lora.name for r in self.running if r.lora is not None}
        evicted: list[Adapter] = []
        for name in list(self.gpu_adapters):
            if len(self.gpu_adapters) <= self.config.max_loras:
                break
            if name not in in_use:
                evicted.append(self.gpu_adapters.pop(name))
        return evicted

    def _activate(self, lora: Adapter, active: set[str], evictions: list[Adapter]) -> AdapterLoad:
        if len(self.gpu_adapters) >= self.config.max_loras:
            for name in self.gpu_adapters:
                if name not in active:
                    evictions.append(self.gpu_adapters.pop(name))
                    break
        from_disk = lora.name not in self.cpu_adapters
        self.cache_adapter(lora)
        self.gpu_adapters[lora.name] = lora
        return AdapterLoad(lora, from_disk)
