"""The simulated GPU: NVML-style utilisation samples, power/thermal/clock behaviour and the allocator model."""

from __future__ import annotations

import math

import pytest

from exporters.serving.engines.sim import load_gpu_profile
from exporters.serving.engines.sim.device import SimulatedGPU, device_state, round_alloc
from loadlens.contracts.device_state import DeviceState

MIB = 1 << 20
A100 = load_gpu_profile("a100-40gb-pcie")


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(gpu=A100, ring: int = 6000) -> tuple[SimulatedGPU, Clock]:  # type: ignore[no-untyped-def]
    clock = Clock()
    dev = SimulatedGPU(gpu, seed=1, ring=ring, clock=clock, realtime=lambda: 1_000.0)
    return dev, clock


def test_samples_are_the_busy_share_of_each_period() -> None:
    dev, clock = make()
    dev.record_busy(100.000, 100.005, memory_fraction=1.0, intensity=0.55)
    dev.record_busy(100.012, 100.020, memory_fraction=0.5, intensity=0.55)
    clock.t = 100.031
    samples = dev.samples_since(0)
    assert [pct for _, pct in samples] == [50.0, 80.0, 0.0]
    assert [ts for ts, _ in samples] == [1_000_010_000, 1_000_020_000, 1_000_030_000]
    assert dev.samples_since(1_000_010_000) == samples[1:]
    snap = dev.snapshot()
    assert snap.util_gpu_percent == 0.0 and snap.clock_event_reasons == ["gpu_idle"]
    assert snap.sm_clock_hz == A100.idle_sm_clock_hz


def test_a_period_still_running_is_not_reported_early() -> None:
    dev, clock = make()
    dev.record_busy(100.0, 100.5, memory_fraction=0.0, intensity=1.0)  # a step planned into the future
    clock.t = 100.025
    assert [pct for _, pct in dev.samples_since(0)] == [100.0, 100.0]


def test_ring_is_bounded_and_long_idle_gaps_are_skipped_in_closed_form() -> None:
    dev, clock = make(ring=10)
    clock.t = 100.0 + 3600.0
    samples = dev.samples_since(0)
    assert len(samples) == 10 and all(pct == 0.0 for _, pct in samples)
    assert samples[-1][0] == int((1_000.0 + 3600.0) * 1e6)
    assert dev.snapshot().energy_joules == pytest.approx(A100.power_idle_watts * 3600.0, rel=1e-6)


def test_full_compute_load_hits_the_power_cap_and_lowers_the_clock() -> None:
    dev, clock = make()
    dev.record_busy(100.0, 102.0, memory_fraction=0.2, intensity=1.0)
    clock.t = 102.0
    snap = dev.snapshot()
    assert snap.util_gpu_percent == 100.0
    assert "sw_power_cap" in snap.clock_event_reasons
    assert snap.power_watts == pytest.approx(A100.power_limit_watts, rel=1e-3)
    dynamic = (A100.power_limit_watts - A100.power_idle_watts) / (A100.power_full_load_watts - A100.power_idle_watts)
    assert snap.sm_clock_hz == pytest.approx(A100.max_sm_clock_hz * dynamic)
    assert snap.energy_joules == pytest.approx(A100.power_limit_watts * 2.0, rel=1e-6)
    assert snap.util_memory_percent == pytest.approx(20.0)


def test_memory_bound_load_stays_under_the_cap_at_full_clock() -> None:
    dev, clock = make()
    dev.record_busy(100.0, 103.0, memory_fraction=1.0, intensity=0.55)
    clock.t = 103.0  # 12 smoothing time constants: converged
    snap = dev.snapshot()
    assert snap.clock_event_reasons == [] and snap.sm_clock_hz == A100.max_sm_clock_hz
    expected = A100.power_idle_watts + (A100.power_full_load_watts - A100.power_idle_watts) * 0.55
    assert snap.power_watts == pytest.approx(expected, rel=1e-3)


def test_temperature_follows_power_with_a_first_order_lag() -> None:
    dev, clock = make()
    start = dev.snapshot().temperature_gpu_celsius
    target = A100.thermal.ambient_celsius + A100.thermal.thermal_resistance_c_per_w * A100.power_limit_watts
    dev.record_busy(100.0, 110.0, memory_fraction=0.0, intensity=1.0)
    clock.t = 110.0
    after = dev.snapshot().temperature_gpu_celsius
    expected = target + (start - target) * math.exp(-10.0 / A100.thermal.time_constant_seconds)
    assert after == pytest.approx(expected, abs=0.01)
    assert dev.snapshot().temperature_memory_celsius == pytest.approx(after + A100.thermal.memory_offset_celsius)


def test_adapters_round_to_two_mib_and_reuse_cached_blocks() -> None:
    dev, _ = make()
    dev.configure_memory(weights=10 << 30, kv_cache=20 << 30, activation_peak=1 << 30, weight_segments=34,
                         kv_segments=32)  # fmt: skip
    module = 1_200_000  # guide 2.2: ~1.2 MB asked, 2 MiB taken
    assert round_alloc(module) == 2 * MIB
    used0 = dev.snapshot().memory_used_bytes
    assert dev.load_adapter("a", [module] * 64)
    snap = dev.snapshot()
    assert snap.memory_by_owner.adapters == 64 * 2 * MIB
    assert snap.memory_used_bytes - used0 == 64 * 2 * MIB
    assert snap.allocator.requested_bytes - snap.allocator.allocated_bytes == 64 * module - 64 * 2 * MIB
    dev.free_adapter("a")
    freed = dev.snapshot()
    assert freed.memory_by_owner.adapters == 0
    assert freed.memory_by_owner.allocator_slack == 64 * 2 * MIB + (1 << 30)  # cached blocks + idle activations
    assert freed.memory_used_bytes == snap.memory_used_bytes  # the cache keeps it reserved
    assert dev.load_adapter("b", [module] * 64)
    assert dev.snapshot().memory_used_bytes == snap.memory_used_bytes  # reused, no growth
    assert dev.load_adapter("c", [module] * 64)
    assert dev.snapshot().memory_used_bytes == snap.memory_used_bytes + 64 * 2 * MIB  # a step up


def test_out_of_memory_retries_once_then_counts_an_oom() -> None:
    dev, _ = make()
    free = A100.memory_bytes - A100.driver_reserved_bytes - A100.cuda_context_bytes
    dev.configure_memory(weights=free - 100 * MIB, kv_cache=0, activation_peak=0, weight_segments=1, kv_segments=0)
    assert dev.load_adapter("a", [2 * MIB] * 40)  # 80 MiB fits
    dev.free_adapter("a")
    assert dev.load_adapter("b", [4 * MIB] * 10)  # cached 2 MiB blocks do not fit: flush them, then fits
    snap = dev.snapshot()
    assert (snap.allocator.alloc_retries, snap.allocator.ooms) == (1, 0)
    assert not dev.load_adapter("c", [4 * MIB] * 20)
    snap = dev.snapshot()
    assert (snap.allocator.alloc_retries, snap.allocator.ooms) == (2, 1)
    assert snap.memory_by_owner.adapters == 40 * MIB


def test_document_validates_and_sums_memory_by_owner() -> None:
    dev, clock = make()
    dev.configure_memory(weights=5 << 30, kv_cache=20 << 30, activation_peak=2 << 30, weight_segments=34,
                         kv_segments=32)  # fmt: skip
    dev.set_activations(1 << 30)
    dev.record_busy(100.0, 100.05, memory_fraction=0.5, intensity=0.8, tensor_fraction=0.25)
    clock.t = 100.1
    doc = DeviceState.model_validate(device_state([dev], 0, realtime=lambda: 2_000.0))
    assert doc.version == 3 and doc.timestamp_us == 2_000_000_000
    gpm = doc.devices[0].gpm
    assert gpm is not None
    # 50 ms of kernels in 5 periods of 10 ms: sums of those periods (rounding of the sums only).
    assert (gpm.sm_active_seconds, gpm.graphics_active_seconds) == (pytest.approx(0.05, rel=1e-12),) * 2
    assert gpm.dram_active_seconds == pytest.approx(0.025, rel=1e-12)
    assert gpm.tensor_active_seconds == pytest.approx(0.0125, rel=1e-12)
    assert (gpm.fp16_active_seconds, gpm.fp32_active_seconds, gpm.pcie_tx_bytes, gpm.pcie_rx_bytes) == (None,) * 4
    d = doc.devices[0]
    assert d.memory_used_bytes == sum(d.memory_by_owner.model_dump().values())
    assert d.allocator.reserved_bytes == d.allocator.allocated_bytes + d.allocator.total_free_bytes
    assert d.allocator.largest_free_block_bytes == 1 << 30
    assert d.uuid.startswith("GPU-") and d.uuid == SimulatedGPU(A100, seed=1).uuid
    assert len(d.util_samples) == 10
