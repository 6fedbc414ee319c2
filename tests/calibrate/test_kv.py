"""The KV capacity calibrate writes: the server's stated capacity, in the sim's 16-token blocks, only when every
stage stated the same one."""

from __future__ import annotations

from exporters.serving.calibrate.kv import kv_decision
from exporters.serving.calibrate.observations import Stage
from loadlens.contracts.kv_capacity import KvCapacity


def stage(name: str, capacity: KvCapacity | None) -> Stage:
    return Stage(name, users=1, prompt_tokens=100.0, output_tokens=10.0, duration_s=10.0, completed=50,
                 kv_capacity=capacity)  # fmt: skip


def test_one_stated_capacity_in_sim_blocks() -> None:
    got = kv_decision([stage("a", KvCapacity(16384, 128)), stage("b", KvCapacity(16384, 128))])
    assert got.capacity == KvCapacity(16384, 128) and got.sim_blocks == 131072
    assert got.reason == (
        "stated by the server: 16384 blocks of 128 tokens = 2097152 tokens, 131072 of the sim's 16-token blocks"
    )


def test_a_block_smaller_than_the_sims_rounds_the_tokens_down() -> None:
    assert kv_decision([stage("a", KvCapacity(1001, 8))]).sim_blocks == 500  # 8,008 tokens


def test_nothing_stated_or_disagreeing_keeps_the_base_profiles() -> None:
    none = kv_decision([stage("a", None)])
    assert (none.capacity, none.sim_blocks) == (None, None)
    assert none.reason == "not stated by the server (no vllm:cache_config_info): the base profile's kept"
    mixed = kv_decision([stage("a", KvCapacity(10, 16)), stage("b", KvCapacity(20, 16)), stage("c", None)])
    assert (mixed.capacity, mixed.sim_blocks) == (None, None)
    assert mixed.reason == (
        "the stages state different capacities (10 x 16, 20 x 16 tokens; none in c): not one server "
        "configuration, the base profile's kept"
    )
