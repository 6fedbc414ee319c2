"""The sim backend against the real simulated engine's ``GET /sim/device-state`` (uvicorn, 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.gpu.collectors import DEFAULT_COLLECTORS
from exporters.gpu.nvml import Nvml
from exporters.gpu.server import GpuExporter
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import open_source
from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile
from exporters.serving.tracing import Tracing
from loadlens.contracts.device_state import DeviceState
from tests.gpu.helpers import Scraped
from tests.support.server import serve_app


@pytest.fixture
def engine_url() -> Iterator[str]:
    registry = CollectorRegistry()
    engine = SimEngine(
        load_model_profile("deepseek-r1-distill-llama-8b"),
        load_gpu_profile("h100-sxm"),
        registry=registry,
        speed=4.0,
        served_model_name="tiny",
    )
    app = create_app(engine, ServeSettings(), registry=registry, tracing=Tracing.disabled())
    with serve_app(app) as url:
        yield url


def test_exporter_reads_the_engine_document(engine_url: str) -> None:
    for _ in range(2):
        r = httpx.post(
            engine_url + "/v1/completions",
            json={"model": "tiny", "prompt": "x", "max_tokens": 32, "ignore_eos": True},
            timeout=30,
        )
        assert r.status_code == 200
    source = open_source(engine_url + "/sim/device-state")
    exporter = GpuExporter(Nvml(SimNvml(source, max_age=0.0)), backend="sim", proc_root=None, stats_every=0.0)
    try:
        exporter.sampler.tick()
        exporter.sampler.tick()
        got = Scraped(exporter.registry)
        doc = DeviceState.model_validate(httpx.get(engine_url + "/sim/device-state").json())
        dev = doc.devices[0]
        labels = {"gpu": "0", "uuid": dev.uuid, "model": dev.name}
        assert got.get("loadlens_gpu_nvml_up") == 1
        assert got.get("loadlens_gpu_devices") == 1
        assert {c: got.get("loadlens_gpu_collector_success", {"collector": c}) for c in DEFAULT_COLLECTORS} == {
            c: 1.0 for c in DEFAULT_COLLECTORS
        }
        assert got.get("loadlens_gpu_memory_total_bytes", labels) == dev.memory_total_bytes
        assert got.get("loadlens_gpu_memory_reserved_bytes", labels) == dev.memory_reserved_bytes
        assert got.get("loadlens_gpu_power_limit_watts", labels) == dev.power_limit_watts
        # The engine samples every 10 ms; requests ran, so the window saw busy periods.
        assert got.get("loadlens_gpu_utilization_sample_interval_seconds", labels) == pytest.approx(0.01)
        assert (got.get("loadlens_gpu_utilization_window_samples", labels) or 0) > 10
        assert (got.get("loadlens_gpu_utilization_window_max_ratio", labels) or 0) > 0
        assert got.get("loadlens_gpu_allocator_reserved_bytes", labels) == dev.allocator.reserved_bytes
        assert got.get("loadlens_gpu_processes", labels) == len(dev.processes)
        owners = got.series("loadlens_gpu_memory_owner_bytes")
        assert sum(owners.values()) == got.get("loadlens_gpu_memory_used_bytes", labels)
    finally:
        exporter.stop()
        source.close()
