"""Knobs against a model and a GPU: start-up precedence, KV sizing, and all-or-nothing run-time plans."""

from __future__ import annotations

import dataclasses

import pytest

from exporters.serving.engine import EngineError
from exporters.serving.engines.sim import load_gpu_profile, load_model_profile, roofline
from exporters.serving.engines.sim.knob_plan import plan_change, scheduler_config, startup_state
from exporters.serving.engines.sim.kv_sizing import cache_config_info
from exporters.serving.engines.sim.sched_types import Policy, SchedulerConfig

TINY = load_model_profile("tiny")
H100 = load_gpu_profile("h100-sxm")
A100 = load_gpu_profile("a100-40gb-pcie")


def test_startup_sizes_the_cache_and_layers_profile_defaults_under_the_callers_knobs() -> None:
    state = startup_state(TINY, A100, {"max_num_seqs": 32})
    assert state.override is None
    assert state.knobs.max_num_batched_tokens == 2048  # the a100-40gb-pcie profile's default (vLLM's on an A100)
    assert state.knobs.max_num_seqs == 32  # the caller's over the profile's 256
    assert state.knobs.num_gpu_blocks == roofline.num_gpu_blocks(TINY, A100, 0.92, 2048, 32)
    pinned = startup_state(TINY, H100, {"num_gpu_blocks": 300})
    assert (pinned.knobs.num_gpu_blocks, pinned.override) == (300, 300)
    assert cache_config_info(pinned.knobs, pinned.override)["num_gpu_blocks_override"] == "300"
    assert cache_config_info(state.knobs, state.override)["num_gpu_blocks_override"] == "None"


def test_plan_keeps_the_cache_size_unless_a_memory_knob_changes() -> None:
    state = startup_state(TINY, H100, {"num_gpu_blocks": 300})
    same = plan_change(state, {"max_num_seqs": 8}, TINY, H100, max_adapter_rank=None)
    assert (same.knobs.num_gpu_blocks, same.override, same.knobs.max_num_seqs) == (300, 300, 8)
    derived = plan_change(same, {"gpu_memory_utilization": 0.5}, TINY, H100, max_adapter_rank=None)
    assert derived.override is None
    assert derived.knobs.num_gpu_blocks == roofline.num_gpu_blocks(TINY, H100, 0.5, 8192, 8)
    assert state.knobs.max_num_seqs == 1024  # plans never modify the state they start from (h100-sxm's default)


@pytest.mark.parametrize(
    ("changes", "rank", "param"),
    [
        ({"max_lora_rank": 8}, 16, "max_lora_rank"),
        ({"max_model_len": 1024}, None, "max_model_len"),
        ({"num_gpu_blocks": 64}, None, "num_gpu_blocks"),
        ({"num_gpu_blocks": 1 << 40}, None, "num_gpu_blocks"),
    ],
)
def test_a_bad_plan_raises_naming_the_knob(changes: dict[str, int], rank: int | None, param: str) -> None:
    state = startup_state(TINY, H100, None)
    with pytest.raises(EngineError) as err:
        plan_change(state, changes, TINY, H100, max_adapter_rank=rank)
    assert err.value.param == param


def test_scheduler_config_follows_the_knobs() -> None:
    k = dataclasses.replace(startup_state(TINY, H100, None).knobs, scheduling_policy="priority", max_loras=2)
    assert scheduler_config(k) == SchedulerConfig(
        max_num_seqs=1024, max_num_batched_tokens=8192, enable_chunked_prefill=True, policy=Policy.PRIORITY,
        max_loras=2, max_cpu_loras=2,
    )  # fmt: skip
