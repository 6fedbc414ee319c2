"""The pure scheduler: budgets, chunked prefill, KV blocks, preemption, policies, LoRA slots, prefix cache."""

from __future__ import annotations

from exporters.serving.engines.sim.block_pool import BlockPool
from exporters.serving.engines.sim.sched_types import Adapter, Policy, SchedRequest, SchedulerConfig, Status
from exporters.serving.engines.sim.scheduler import Scheduler


def sched(blocks: int = 1000, **cfg: object) -> Scheduler:
    return Scheduler(SchedulerConfig(**cfg), blocks)  # type: ignore[arg-type]


def req(rid: str, prompt: int, *, priority: int = 0, lora: Adapter | None = None, arrival: float = 0.0,
        hashes: tuple[int, ...] = ()) -> SchedRequest:  # fmt: skip
    return SchedRequest(request_id=rid, prompt_len=prompt, priority=priority, lora=lora, arrival=arrival,
                        block_hashes=hashes)  # fmt: skip


def adapter(name: str) -> Adapter:
    return Adapter(name=name, int_id=1, path="/x", rank=8, alpha=16, target_modules=("q_proj",), params=1, nbytes=2)


def step(s: Scheduler, cutoff: float = float("inf")) -> tuple[dict[str, int], list[str]]:
    """Schedule and complete one step: ({request: tokens}, [requests that sampled])."""
    batch = s.schedule(cutoff)
    planned = {r.request_id: n for r, n in zip(batch.reqs, batch.num_new, strict=True)}
    return planned, [r.request_id for r in s.complete(batch)]


def test_chunked_prefill_respects_the_token_budget() -> None:
    s = sched(max_num_batched_tokens=64)
    r = req("a", 150)
    s.add(r)
    assert step(s) == ({"a": 64}, [])
    assert step(s) == ({"a": 64}, [])
    assert step(s) == ({"a": 22}, ["a"])
    assert step(s) == ({"a": 1}, ["a"])
    assert r.num_output == 2 and r.num_computed == 151
    assert r.blocks_held == 10  # ceil(151 / 16)


def test_running_requests_go_first_and_prefills_share_the_rest_of_the_budget() -> None:
    s = sched(max_num_batched_tokens=100)
    s.add(req("a", 30))
    step(s)
    s.add(req("b", 200))
    assert step(s) == ({"a": 1, "b": 99}, ["a"])


def test_without_chunked_prefill_a_long_prompt_waits_for_a_whole_budget() -> None:
    s = sched(max_num_batched_tokens=100, enable_chunked_prefill=False)
    s.add(req("a", 50))
    s.add(req("b", 60))
    s.add(req("c", 10))
    assert step(s) == ({"a": 50}, ["a"])  # b does not fit the remaining 50, and blocks c behind it (FCFS)
    assert step(s) == ({"a": 1, "b": 60, "c": 10}, ["a", "b", "c"])


def test_max_num_seqs_bounds_the_batch() -> None:
    s = sched(max_num_seqs=2)
    for rid in "abc":
        s.add(req(rid, 5))
    assert step(s) == ({"a": 5, "b": 5}, ["a", "b"])
    assert s.num_waiting == 1


def test_requests_arriving_after_the_step_start_wait_for_the_next_step() -> None:
    s = sched()
    s.add(req("a", 5, arrival=1.0))
    s.add(req("b", 5, arrival=2.0))
    assert step(s, cutoff=1.5) == ({"a": 5}, ["a"])
    assert step(s, cutoff=2.5) == ({"a": 1, "b": 5}, ["a", "b"])


def test_priority_policy_orders_by_value_then_arrival() -> None:
    s = sched(max_num_seqs=1, policy=Policy.PRIORITY)
    for rid, prio in [("a", 5), ("b", 0), ("c", -2), ("d", 0)]:
        s.add(req(rid, 4, priority=prio))
    order = []
    while s.has_work():
        planned, sampled = step(s)
        if planned.get(sampled[0]) == 4:
            order.append(sampled[0])
        s.finish([r for r in s.running])
    assert order == ["c", "b", "d", "a"]


def test_fcfs_preempts_the_latest_arrival_and_it_recomputes_its_output() -> None:
    s = sched(blocks=4)  # 64 tokens of KV
    a, b = req("a", 32), req("b", 30)
    s.add(a)
    s.add(b)
    assert step(s) == ({"a": 32, "b": 30}, ["a", "b"])  # 2 blocks each: 4 in use
    # a needs a third block for its 33rd token: b (latest) is preempted, its blocks freed.
    assert step(s) == ({"a": 1}, ["a"])
    assert b.status is Status.PREEMPTED and b.num_preemptions == 1 and b.num_computed == 0
    assert b.num_output == 1  # kept: recompute covers prompt + output
    assert s.pool.num_used == 3
    assert step(s) == ({"a": 1}, ["a"])  # b (31 tokens, 2 blocks) does not fit the one free block
    s.finish([a])
    assert step(s) == ({"b": 31}, ["b"])
    assert b.num_output == 2


def test_priority_policy_preempts_the_lowest_priority_even_if_it_arrived_first() -> None:
    s = sched(blocks=4, policy=Policy.PRIORITY)
    low, high = req("low", 30, priority=9), req("high", 32, priority=0)
    s.add(low)
    s.add(high)
    step(s)
    batch = s.schedule()
    assert [r.request_id for r in batch.preempted] == ["low"]
    assert [r.request_id for r in batch.reqs] == ["high"]


def test_preemption_stops_admission_of_waiting_requests_in_that_step() -> None:
    s = sched(blocks=4)
    s.add(req("a", 32))
    s.add(req("b", 30))
    step(s)
    s.add(req("c", 1))
    batch = s.schedule()
    assert batch.preempted and "c" not in [r.request_id for r in batch.reqs]


def test_lora_requests_beyond_max_loras_are_deferred_and_keep_their_place() -> None:
    s = sched(max_loras=1, max_cpu_loras=1)
    x, y = adapter("x"), adapter("y")
    s.cache_adapter(x)
    s.add(req("x1", 5, lora=x))
    s.add(req("y1", 5, lora=y))
    s.add(req("base", 5))
    batch = s.schedule()
    assert [r.request_id for r in batch.reqs] == ["x1", "base"]
    assert [(load.adapter.name, load.from_disk) for load in batch.adapter_loads] == [("x", False)]
    assert s.num_deferred == 1
    s.complete(batch)
    s.finish(list(s.running))
    batch = s.schedule()
    assert [r.request_id for r in batch.reqs] == ["y1"]
    # y was never in the host cache (max_cpu_loras = 1 holds x): a storage read, and x leaves its slot.
    assert [(load.adapter.name, load.from_disk) for load in batch.adapter_loads] == [("y", True)]
    assert [a.name for a in batch.adapter_evictions] == ["x"]
    assert list(s.gpu_adapters) == ["y"] and list(s.cpu_adapters) == ["y"]


def test_two_slots_hold_two_adapters_without_reloading() -> None:
    s = sched(max_loras=2, max_cpu_loras=2)
    x, y = adapter("x"), adapter("y")
    for r in (req("x1", 5, lora=x), req("y1", 5, lora=y)):
        s.add(r)
    first = s.schedule()
    assert len(first.adapter_loads) == 2
    s.complete(first)
    s.finish(list(s.running))
    s.add(req("x2", 5, lora=x))
    assert s.schedule().adapter_loads == []


def test_unloaded_adapter_leaves_its_slot_once_idle() -> None:
    s = sched(max_loras=1)
    x = adapter("x")
    r = req("x1", 5, lora=x)
    s.add(r)
    s.complete(s.schedule())
    assert s.forget_adapter(x) == []  # in use: stays
    s.finish([r])
    assert [a.name for a in s.schedule().adapter_evictions] == ["x"]


def test_prefix_cache_reuses_full_blocks_and_never_the_last_token() -> None:
    s = sched()
    hashes = (11, 12, 13)  # 48 tokens of full blocks
    a = req("a", 50, hashes=hashes)
    s.add(a)
    batch = s.schedule()
    assert (batch.prefix_queries, batch.prefix_hits) == (50, 0)
    s.complete(batch)
    b = req("b", 50, hashes=hashes)
    s.add(b)
    batch = s.schedule()
    assert (batch.prefix_queries, batch.prefix_hits) == (50, 48)
    assert dict(zip([r.request_id for r in batch.reqs], batch.num_new, strict=True)) == {"a": 1, "b": 2}
    assert b.num_cached_tokens == 48
    s.complete(batch)
    # Exactly 48 tokens: the last block must be recomputed to sample, so only two blocks hit.
    c = req("c", 48, hashes=hashes)
    s.add(c)
    batch = s.schedule()
    assert batch.prefix_hits == 32
    assert s.pool.num_used == 4 + 1 + 1  # a: 4 blocks; b: 3 shared + 1 own; c: 2 shared + 1 own
    s.complete(batch)
    s.finish([a, b, c])
    assert s.pool.num_used == 0 and s.pool.usage() == 0.0
    assert s.pool.num_cached == 3  # still reusable


def test_block_pool_evicts_cached_blocks_tail_first() -> None:
    pool = BlockPool(4)
    r = SchedRequest("r", 64, block_hashes=(1, 2, 3))
    assert pool.allocate(4)
    r.blocks_held = 4
    r.cached_blocks = [b for h in (1, 2, 3) if (b := pool.promote(h)) is not None]
    pool.release(r)
    assert pool.num_free == 4 and pool.num_cached == 3
    assert pool.allocate(2)  # one never-used block, then evict the least recently freed: the tail (3)
    assert [b.hash for b in pool.lookup((1, 2, 3), 3)] == [1, 2]


def test_abort_frees_blocks_from_running_and_waiting() -> None:
    s = sched(max_num_seqs=1)
    a, b = req("a", 40), req("b", 40)
    s.add(a)
    s.add(b)
    s.complete(s.schedule())
    assert s.pool.num_used == 3
    s.abort(a)
    s.abort(b)
    assert s.pool.num_used == 0 and not s.has_work() and s.waiting_tokens == 0


def test_shrinking_the_pool_preempts_until_it_fits() -> None:
    s = sched(blocks=100)
    for rid in "abc":
        s.add(req(rid, 160))  # 10 blocks each, 11 after the first token
    s.complete(s.schedule())
    s.complete(s.schedule())
    preempted = s.resize(20)
    assert [r.request_id for r in preempted] == ["c", "b"]
    assert s.pool.num_used == 11 and s.pool.num_blocks == 20


def test_switching_policy_keeps_waiting_requests() -> None:
    s = sched(max_num_seqs=1)
    for rid, prio in [("a", 3), ("b", 1), ("c", 2)]:
        s.add(req(rid, 4, priority=prio))
    s.set_policy(Policy.PRIORITY)
    assert [r.request_id for r in s.waiting] == ["b", "c", "a"]
    s.set_policy(Policy.FCFS)
    assert [r.request_id for r in s.waiting] == ["a", "b", "c"]


def test_block_pool_reports_the_residency_of_evicted_cached_blocks() -> None:
    """vLLM's --kv-cache-metrics sample, for every prefix-cached block: at eviction, its lifetime since it
    entered the cache, its idle time since the last access and the gaps between its (last 4) accesses."""
    now = [100.0]
    pool = BlockPool(4, clock=lambda: now[0])
    evicted: list[tuple[float, float, list[float]]] = []
    pool.on_evict = lambda life, idle, gaps: evicted.append((life, idle, list(gaps)))
    r = SchedRequest("r", 64, block_hashes=(1, 2, 3))
    assert pool.allocate(4)
    r.blocks_held = 4
    r.cached_blocks = [b for h in (1, 2, 3) if (b := pool.promote(h)) is not None]  # enter the cache at 100
    pool.release(r)
    now[0] = 101.0
    again = SchedRequest("again", 32, block_hashes=(1, 2))
    hits = pool.lookup(again.block_hashes, 2)
    pool.touch(hits)  # blocks 1 and 2 are hit at 101
    again.cached_blocks, again.blocks_held = hits, 2
    pool.release(again)
    now[0] = 106.0
    assert pool.allocate(4)  # one never-used block, then all three cached ones, least recently freed first
    assert evicted == [(6.0, 6.0, []), (6.0, 5.0, [1.0]), (6.0, 5.0, [1.0])]
    assert pool.num_cached == 0


def test_block_pool_keeps_the_last_four_accesses() -> None:
    """Entering the cache at 0, hit at 1, 3, 6, 10 and 15: the gaps reported are those of the last four."""
    now = [0.0]
    pool = BlockPool(2, clock=lambda: now[0])
    evicted: list[list[float]] = []
    pool.on_evict = lambda life, idle, gaps: evicted.append(list(gaps))
    r = SchedRequest("r", 16, block_hashes=(7,))
    assert pool.allocate(1)
    r.blocks_held = 1
    r.cached_blocks = [b for b in [pool.promote(7)] if b is not None]
    pool.release(r)
    for t in (1.0, 3.0, 6.0, 10.0, 15.0):
        now[0] = t
        hits = pool.lookup((7,), 1)
        pool.touch(hits)
        user = SchedRequest("u", 16, block_hashes=(7,))
        user.cached_blocks, user.blocks_held = hits, 1
        pool.release(user)
    now[0] = 20.0
    assert pool.allocate(2)
    assert evicted == [[3.0, 4.0, 5.0]]  # accesses at 3, 6, 10, 15 kept; 0 and 1 dropped
