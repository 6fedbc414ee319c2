"""Scheduler.reconfigure: run-time knob changes applied inside the scheduler, with its invariants kept."""

from __future__ import annotations

from exporters.serving.engines.sim.sched_types import Policy, SchedulerConfig, Status
from exporters.serving.engines.sim.scheduler import Scheduler
from tests.sim.test_scheduler import adapter, req, sched, step


def test_limits_change_and_running_requests_are_never_dropped_for_them() -> None:
    s = sched(max_num_seqs=4, max_num_batched_tokens=64)
    for rid in "abc":
        s.add(req(rid, 5))
    step(s)
    done = s.reconfigure(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=32), num_blocks=1000,
                         enable_prefix_caching=True)  # fmt: skip
    assert (done.preempted, done.evicted) == ([], [])
    assert (s.config.max_num_seqs, s.config.max_num_batched_tokens) == (1, 32)
    assert [r.request_id for r in s.running] == ["a", "b", "c"]  # over the new bound, still running
    s.add(req("d", 5))
    assert step(s) == ({"a": 1, "b": 1, "c": 1}, ["a", "b", "c"])  # but nothing more is admitted
    assert s.num_waiting == 1


def test_a_new_policy_reorders_the_waiting_queue() -> None:
    s = sched(max_num_seqs=1)
    for rid, prio in (("a", 0), ("b", 5), ("c", -1)):
        s.add(req(rid, 5, priority=prio))
    s.reconfigure(SchedulerConfig(max_num_seqs=1, policy=Policy.PRIORITY), num_blocks=1000,
                  enable_prefix_caching=True)  # fmt: skip
    assert s.config.policy is Policy.PRIORITY
    assert [r.request_id for r in s.waiting] == ["c", "a", "b"]
    assert s.waiting_tokens == 15


def test_a_smaller_cache_preempts_in_the_new_policy_order() -> None:
    s = sched(blocks=100)
    low, high = req("low", 160, priority=5), req("high", 160, priority=0)
    s.add(low)
    s.add(high)
    step(s)
    assert s.pool.num_used == 20  # 160 prompt tokens = 10 blocks each
    done = s.reconfigure(SchedulerConfig(policy=Policy.PRIORITY), num_blocks=15, enable_prefix_caching=True)
    assert done.preempted == [low]  # under fcfs it would have been "high", the later arrival
    assert low.status is Status.PREEMPTED and low.num_computed == 0
    assert (s.pool.num_blocks, s.pool.num_used) == (15, 10)
    assert [r.request_id for r in s.waiting] == ["low"]


def test_toggling_prefix_caching_forgets_unreferenced_cached_blocks() -> None:
    s = sched()
    hashes = (11, 12)
    s.add(req("a", 40, hashes=hashes))
    step(s)
    s.finish(list(s.running))
    assert s.pool.num_cached == 2
    s.reconfigure(SchedulerConfig(), num_blocks=1000, enable_prefix_caching=False)
    assert (s.pool.num_cached, s.pool.enable_caching) == (0, False)
    s.add(req("b", 40, hashes=hashes))
    assert s.schedule().prefix_hits == 0


def test_fewer_slots_evict_idle_adapters_and_trim_the_host_cache_lru_first() -> None:
    s = sched(max_loras=3, max_cpu_loras=3)
    x, y, z = adapter("x"), adapter("y"), adapter("z")
    for i, a in enumerate((x, y, z)):
        s.add(req(f"r{i}", 5, lora=a))
    step(s)
    s.finish([r for r in s.running if r.lora is not y])  # y stays busy
    done = s.reconfigure(SchedulerConfig(max_loras=1, max_cpu_loras=1), num_blocks=1000, enable_prefix_caching=True)
    assert done.evicted == [x, z]
    assert list(s.gpu_adapters) == ["y"]
    assert list(s.cpu_adapters) == ["z"]  # the host cache keeps its most recently cached one


def test_reconfigure_to_the_same_limits_changes_nothing() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=2), 50)
    s.add(req("a", 30))
    step(s)
    done = s.reconfigure(SchedulerConfig(max_num_seqs=2), num_blocks=50, enable_prefix_caching=True)
    assert (done.preempted, done.evicted) == ([], [])
    assert (s.pool.num_blocks, s.pool.num_used, len(s.running)) == (50, 2, 1)
