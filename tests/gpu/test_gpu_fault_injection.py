"""Fault injection end to end through the assembled exporter: it never crashes, other GPUs' series stay
intact, and the health series say what failed."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from exporters.gpu.collectors import DEFAULT_COLLECTORS
from exporters.gpu.faults import parse_faults
from exporters.gpu.nvml import Nvml
from exporters.gpu.server import GpuExporter
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource
from tests.gpu.helpers import FakeClock, Scraped, default_state

MODEL = "NVIDIA H100 80GB HBM3"


def labels(i: int) -> dict[str, str]:
    return {"gpu": str(i), "uuid": f"GPU-5e1f0000-0000-4000-8000-{i:012x}", "model": MODEL}


def build(faults: str, clock: FakeClock, source: StaticSource | None = None) -> tuple[GpuExporter, SimNvml]:
    sim = SimNvml(source or StaticSource(default_state()), faults=parse_faults(faults), max_age=0.0, clock=clock)
    # One fake monotonic clock drives the re-init backoff, the sampler's schedule and the sample ages.
    exporter = GpuExporter(Nvml(sim), backend="sim", proc_root=None, monotonic=clock)
    return exporter, sim


def success(got: Scraped) -> dict[str, float]:
    return {dict(k)["collector"]: v for k, v in got.series("loadlens_gpu_collector_success").items()}


ALL_OK = dict.fromkeys(DEFAULT_COLLECTORS, 1.0)
ALL_FAILED = dict.fromkeys(DEFAULT_COLLECTORS, 0.0)
# GPU 0 and GPU 1 of the default document read the same.
GPU_VALUES = {
    "power_watts": 412.5,
    "memory_used_bytes": 72 * 2**30,
    "utilization_ratio": 0.62,
    "allocator_reserved_bytes": 71 * 2**30,
}


def test_device_lost_mid_run_then_back() -> None:
    clock = FakeClock()
    exporter, _ = build("lost:1@10-40", clock)
    exporter.sampler.tick()
    before = Scraped(exporter.registry)
    assert before.get("loadlens_gpu_power_watts", labels(1)) == 412.5

    clock.advance(10)  # GPU 1 falls off the bus
    exporter.sampler.tick()
    during = Scraped(exporter.registry)
    assert during.get("loadlens_gpu_device_up", labels(1)) == 0
    assert during.get("loadlens_gpu_device_up", labels(0)) == 1
    for name, value in GPU_VALUES.items():
        assert before.get(f"loadlens_gpu_{name}", labels(1)) == value, name
        assert during.get(f"loadlens_gpu_{name}", labels(1)) is None, name  # gone, not stale
        assert during.get(f"loadlens_gpu_{name}", labels(0)) == value, name
    assert success(during) == ALL_OK
    assert during.get("loadlens_gpu_nvml_reinits_total") == 0
    assert during.get("loadlens_gpu_nvml_up") == 1
    assert during.get("loadlens_gpu_nvml_errors_total", {"collector": "sampler", "error": "GpuIsLost"}) == 1

    clock.advance(30)  # recovered; the scheduled re-init brings it back
    exporter.sampler.tick()
    after = Scraped(exporter.registry)
    assert after.get("loadlens_gpu_device_up", labels(1)) == 1
    assert after.get("loadlens_gpu_power_watts", labels(1)) == 412.5
    assert after.get("loadlens_gpu_nvml_reinits_total") == 1  # one re-init, when the GPU came back
    assert after.series("loadlens_gpu_nvml_errors_total") == {
        frozenset({("collector", "sampler"), ("error", "GpuIsLost")}): 1.0
    }
    assert success(after) == ALL_OK


def test_not_supported_fields_are_absent_everywhere() -> None:
    clock = FakeClock()
    exporter, _ = build("unsupported:power,unsupported:memory-temperature:0,unsupported:samples", clock)
    exporter.sampler.tick()
    got = Scraped(exporter.registry)
    assert got.series("loadlens_gpu_power_watts") == {}
    assert got.get("loadlens_gpu_memory_temperature_celsius", labels(0)) is None
    assert got.get("loadlens_gpu_memory_temperature_celsius", labels(1)) == 68.0
    assert got.series("loadlens_gpu_utilization_window_mean_ratio") == {}
    assert got.get("loadlens_gpu_utilization_ratio", labels(0)) == 0.62
    assert success(got) == ALL_OK  # NotSupported is not a failure
    assert got.series("loadlens_gpu_nvml_errors_total") == {}
    text = generate_latest(exporter.registry).decode()
    assert "loadlens_gpu_power_watts{" not in text  # never a 0


def test_init_failure_then_recovery() -> None:
    clock = FakeClock()
    exporter, sim = build("init-fail:2", clock)
    exporter.sample_now()
    first = Scraped(exporter.registry)
    assert first.get("loadlens_gpu_nvml_up") == 0
    assert success(first) == ALL_FAILED
    assert first.get("loadlens_gpu_nvml_init_failures_total") == 1
    assert first.series("loadlens_gpu_memory_used_bytes") == {}
    clock.advance(1)
    exporter.sample_now()
    assert Scraped(exporter.registry).get("loadlens_gpu_nvml_up") == 0  # second failure, backoff 2 s
    clock.advance(2)
    exporter.sample_now()
    ok = Scraped(exporter.registry)
    assert ok.get("loadlens_gpu_nvml_up") == 1
    assert success(ok) == ALL_OK
    assert ok.get("loadlens_gpu_nvml_init_failures_total") == 2
    assert ok.get("loadlens_gpu_memory_total_bytes", labels(0)) == 80 * 2**30
    assert sim.init_calls == 3


def test_engine_unreachable_mid_run() -> None:
    clock = FakeClock()
    source = StaticSource(default_state())
    exporter, _ = build("", clock, source)
    exporter.sample_now()
    assert Scraped(exporter.registry).get("loadlens_gpu_nvml_up") == 1
    source.fail = OSError("connection refused")
    exporter.collector.sample()  # the collectors' pass alone (no poll first), as it runs on its own schedule
    down = Scraped(exporter.registry)
    assert down.get("loadlens_gpu_nvml_up") == 0
    # device reads no NVML (identity is cached at init); the first collector to call NVML finds it down and
    # every later one skips.
    assert success(down) == {**ALL_FAILED, "device": 1.0}
    assert down.series("loadlens_gpu_nvml_errors_total") == {
        frozenset({("collector", "utilization"), ("error", "SimDocumentUnavailable")}): 1.0
    }
    assert down.series("loadlens_gpu_memory_used_bytes") == {}
    source.fail = None
    clock.advance(1)
    exporter.sample_now()
    assert Scraped(exporter.registry).get("loadlens_gpu_nvml_up") == 1


def test_processes_appear_and_vanish() -> None:
    clock = FakeClock()
    exporter, _ = build("process-churn", clock)
    counts = []
    for _ in range(4):
        exporter.sample_now()
        got = Scraped(exporter.registry)
        counts.append(got.get("loadlens_gpu_processes", labels(0)))
        assert success(got)["processes"] == 1
    assert counts == [3, 1, 3, 1]


@pytest.mark.parametrize("collector", DEFAULT_COLLECTORS)
def test_every_collector_survives_every_device_lost(collector: str) -> None:
    clock = FakeClock()
    sim = SimNvml(StaticSource(default_state()), faults=parse_faults("lost:0@0,lost:1@0"), max_age=0.0, clock=clock)
    exporter = GpuExporter(Nvml(sim), backend="sim", collectors=[collector], proc_root=None)
    exporter.sample_now()
    got = Scraped(exporter.registry)
    assert got.get("loadlens_gpu_devices") == 2
    assert got.get("loadlens_gpu_collector_success", {"collector": collector}) == 0  # no GPU up
