"""DeviceModel: the engine's knobs, adapters and priced steps as simulated-GPU memory and activity."""

from __future__ import annotations

import dataclasses

import pytest

from exporters.serving.engines.sim import load_gpu_profile, load_model_profile, roofline
from exporters.serving.engines.sim.device import SimulatedGPU, round_alloc
from exporters.serving.engines.sim.device_model import DeviceModel, roofline_intensity
from exporters.serving.engines.sim.knobs import Knobs
from exporters.serving.engines.sim.roofline import StepCost
from exporters.serving.engines.sim.sched_types import Adapter
from tests.sim.roofline_shapes import decode_shape

LLAMA = load_model_profile("deepseek-r1-distill-llama-8b")
H100 = load_gpu_profile("h100-sxm")


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def make() -> tuple[DeviceModel, Clock]:
    clock = Clock()
    gpu = SimulatedGPU(H100, seed=0, clock=clock, realtime=lambda: 1_000.0)
    return DeviceModel(LLAMA, H100, seed=0, device=gpu), clock


def test_intensity_runs_from_memory_bound_to_compute_bound() -> None:
    assert roofline_intensity(0.0, 1.0) == 0.55
    assert roofline_intensity(1.0, 1.0) == 1.0
    assert roofline_intensity(0.5, 1.0) == 0.55 + 0.45 * 0.5
    assert roofline_intensity(0.0, 0.0) == 0.0


def test_configure_reserves_weights_kv_cache_and_activations() -> None:
    dm, _ = make()
    k = Knobs(num_gpu_blocks=1000, max_num_batched_tokens=4096, max_num_seqs=64)
    dm.configure(k)
    owners = dm.state()["devices"][0]["memory_by_owner"]
    assert owners["weights"] == roofline.weight_bytes(LLAMA)
    assert owners["kv_cache"] == 1000 * roofline.kv_block_bytes(LLAMA)
    assert owners["activations"] == 0  # reserved, not in use: allocator slack
    assert owners["allocator_slack"] == roofline.activation_bytes(LLAMA, 4096, 64)
    dm.configure(dataclasses.replace(k, num_gpu_blocks=500, max_num_batched_tokens=1024))
    owners = dm.state()["devices"][0]["memory_by_owner"]
    assert owners["kv_cache"] == 500 * roofline.kv_block_bytes(LLAMA)
    assert owners["allocator_slack"] == roofline.activation_bytes(LLAMA, 4096, 64)  # the pool never shrinks


def test_adapters_allocate_one_rounded_block_per_layer_and_module() -> None:
    dm, _ = make()
    dm.configure(Knobs(num_gpu_blocks=1000))
    a = Adapter("a", 1, "/a", 8, 16.0, ("q_proj", "v_proj"), params=0, nbytes=0)
    assert dm.load_adapter(a)
    sizes = roofline.adapter_module_bytes(LLAMA, 8, ("q_proj", "v_proj"))
    assert dm.state()["devices"][0]["memory_by_owner"]["adapters"] == sum(round_alloc(b) for b in sizes)
    dm.free_adapter(a)
    doc = dm.state()["devices"][0]
    assert doc["memory_by_owner"]["adapters"] == 0
    assert doc["allocator"]["total_free_bytes"] >= sum(round_alloc(b) for b in sizes)  # kept cached


@pytest.mark.parametrize(("compute", "memory", "mem_util"), [(0.002, 0.008, 80.0), (0.008, 0.002, 20.0)])
def test_a_step_is_busy_from_its_kernel_start_with_its_memory_share(
    compute: float, memory: float, mem_util: float
) -> None:
    dm, clock = make()
    cost = StepCost(compute_seconds=compute, memory_seconds=memory, overhead_seconds=0.001, lora_seconds=0.0,
                    dequant_seconds=0.0, stall_seconds=0.0, flops=0.0, bytes_moved=0.0)  # fmt: skip
    dm.record_step(cost, decode_shape(4, 100), busy_start=100.002, end=100.010)
    clock.t = 100.0101
    dev = dm.state()["devices"][0]
    assert [s["gpu_percent"] for s in dev["util_samples"]] == [80.0]
    assert dev["util_memory_percent"] == pytest.approx(mem_util, abs=1e-3)
    assert dev["memory_by_owner"]["activations"] == roofline.activation_bytes(LLAMA, 4, 4)
    # GPM counters: 8 ms of kernels; the tensor pipes busy for the compute share, DRAM for the memory share.
    gpm = dev["gpm"]
    busy = 0.008
    assert gpm["sm_active_seconds"] == pytest.approx(busy, rel=1e-9)
    assert gpm["tensor_active_seconds"] == pytest.approx(busy * compute / max(compute, memory), rel=1e-9)
    assert gpm["dram_active_seconds"] == pytest.approx(busy * memory / max(compute, memory), rel=1e-9)
