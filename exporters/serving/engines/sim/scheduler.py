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

import math
from collections import OrderedDict
from collections.abc import Iterable

from exporters.serving.engines.sim.block_pool import BlockPool
from exporters.serving.engines.sim.roofline import BLOCK_SIZE, BatchShape, LoraWork, attn_pairs
from exporters.serving.engines.sim.sched_types import (
    Adapter,
    AdapterLoad,
    Policy,
    Reconfigured,
    SchedRequest,
    ScheduledBatch,
    SchedulerConfig,
    Status,
    cdiv,
)
from exporters.serving.engines.sim.stats import SchedulerStats
from exporters.serving.engines.sim.wait_queue import WaitQueue


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

    def earliest_arrival(self) -> float | None:
        return min((r.arrival for r in self.waiting.unordered()), default=None)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(len(self.running), len(self.waiting), self.num_deferred, self.pool.usage())

    def adapters_in_use(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Sorted names of the adapters of waiting requests and of running ones."""
        waiting = sorted({r.lora.name for r in self.waiting.unordered() if r.lora is not None})
        running = sorted({r.lora.name for r in self.running if r.lora is not None})
        return tuple(waiting), tuple(running)

    def reconfigure(self, config: SchedulerConfig, *, num_blocks: int, enable_prefix_caching: bool) -> Reconfigured:
        """Apply new limits while requests are in flight, keeping every invariant they touch: the waiting queue
        is re-ordered for a new policy; turning prefix caching off or on forgets unreferenced cached blocks; a
        smaller cache preempts running requests (policy order) until the blocks in use fit; idle GPU slots
        beyond ``max_loras`` are evicted (LRU first) and the host cache is trimmed to ``max_cpu_loras``.
        Limits only bound what is admitted from now on: running requests are never dropped for them."""
        cfg = self.config
        cfg.max_num_seqs = config.max_num_seqs
        cfg.max_num_batched_tokens = config.max_num_batched_tokens
        cfg.enable_chunked_prefill = config.enable_chunked_prefill
        cfg.max_loras = config.max_loras
        cfg.max_cpu_loras = config.max_cpu_loras
        self.set_policy(config.policy)  # before resizing: the policy picks the victims
        if enable_prefix_caching != self.pool.enable_caching:
            self.pool.reset_cache(enable_prefix_caching)
        preempted = self.resize(num_blocks) if num_blocks != self.pool.num_blocks else []
        evicted = self.shrink_gpu_slots()
        self._trim_host_cache()
        return Reconfigured(preempted, evicted)

    def set_policy(self, policy: Policy) -> None:
        if policy is self.config.policy:
            return
        old = sorted(self.waiting, key=lambda r: r.seq)
        self.config.policy = policy
        self.waiting = WaitQueue(policy)
        for req in old:
            self.waiting.add(req)

    # --- the step ------------------------------------------------------------------------------------------

    def schedule(self, cutoff: float = math.inf, *, admit: bool = True) -> ScheduledBatch:
        """Plan one step that starts at time ``cutoff``: requests that arrived later wait for the next one.
        ``admit=False`` schedules the running requests only (an admission window is still gathering)."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: dict[SchedRequest, int] = {}
        preempted: list[SchedRequest] = []
        newly: list[SchedRequest] = []
        loads: list[AdapterLoad] = []
        evictions: list[Adapter] = []
        queries = hits_total = admitted = 0

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
        if admit and not preempted:
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
                admitted += 1
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
            num_admitted=admitted,
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
        return self._trim_host_cache()

    def _trim_host_cache(self) -> list[Adapter]:
        dropped: list[Adapter] = []
        while len(self.cpu_adapters) > self.config.max_cpu_loras:
            _, old = self.cpu_adapters.popitem(last=False)
            dropped.append(old)
        return dropped

    def release_gpu_slot(self, adapter: Adapter) -> None:
        """The device could not hold the adapter: empty its slot (its requests are the caller's to end)."""
        self.gpu_adapters.pop(adapter.name, None)

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
