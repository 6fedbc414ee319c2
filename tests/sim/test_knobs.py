"""Knob validation: types, ranges, cross-knob rules; errors name the offending knob."""

from __future__ import annotations

from typing import Any

import pytest

from exporters.serving.engine import EngineError, ErrorKind
from exporters.serving.engines.sim.knobs import KNOB_NAMES, Knobs, merge


def test_defaults_follow_vllm() -> None:
    k = Knobs()
    assert (k.max_num_seqs, k.max_num_batched_tokens, k.enable_chunked_prefill) == (256, 8192, True)
    assert (k.scheduling_policy, k.max_loras, k.max_lora_rank, k.gpu_memory_utilization) == ("fcfs", 1, 16, 0.92)
    assert k.batching_window_us == 0.0 and k.enable_prefix_caching is True
    assert k.effective_max_cpu_loras == 1
    assert set(k.as_dict()) == set(KNOB_NAMES)


@pytest.mark.parametrize(
    ("changes", "param", "text"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs", "must be between 1 and 65536, got 0"),
        ({"max_num_seqs": True}, "max_num_seqs", "must be an integer, got True"),
        ({"max_num_seqs": 8.0}, "max_num_seqs", "must be an integer, got 8.0"),
        ({"batching_window_us": -1}, "batching_window_us", "must be in [0.0, 1000000.0], got -1"),
        ({"batching_window_us": float("nan")}, "batching_window_us", "must be a finite number"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization", "must be in (0.0, 1.0], got 0"),
        ({"scheduling_policy": "edf"}, "scheduling_policy", "must be one of fcfs, priority, got 'edf'"),
        ({"max_lora_rank": 48}, "max_lora_rank", "must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512, got 48"),
        ({"enable_chunked_prefill": "yes"}, "enable_chunked_prefill", "must be true or false, got 'yes'"),
        ({"warp_drive": 1}, "warp_drive", "unknown knob (known: max_num_seqs, "),
        ({"max_num_batched_tokens": 100}, "max_num_batched_tokens", "must be >= max_num_seqs (256)"),
        ({"max_num_seqs": 9000}, "max_num_seqs", "max_num_batched_tokens (8192) must be >= max_num_seqs (9000)"),
        ({"enable_chunked_prefill": False}, "enable_chunked_prefill", "must be >= max_model_len (10000)"),
        ({"max_cpu_loras": 1, "max_loras": 2}, "max_cpu_loras", "max_cpu_loras (1) must be >= max_loras (2)"),
        ({"max_loras": 3, "max_cpu_loras": 2}, "max_cpu_loras", "must be >= max_loras"),
    ],
)
def test_bad_values_name_the_knob(changes: dict[str, Any], param: str, text: str) -> None:
    with pytest.raises(EngineError) as err:
        merge(Knobs(max_model_len=10000), changes)
    assert err.value.kind is ErrorKind.INVALID_REQUEST
    assert err.value.param == param
    assert err.value.message.startswith(f"knob {param}: ")
    assert text in err.value.message


def test_good_changes_apply_together_and_leave_the_input_alone() -> None:
    base = Knobs()
    new = merge(base, {"max_num_seqs": 32, "scheduling_policy": "priority", "max_cpu_loras": None,
                       "batching_window_us": 100, "num_gpu_blocks": 4096})  # fmt: skip
    assert (new.max_num_seqs, new.scheduling_policy, new.batching_window_us) == (32, "priority", 100.0)
    assert new.num_gpu_blocks == 4096
    assert base.max_num_seqs == 256


def test_chunked_prefill_may_be_disabled_when_the_budget_covers_a_whole_context() -> None:
    new = merge(Knobs(max_model_len=4096), {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096})
    assert new.enable_chunked_prefill is False
