"""Collector plumbing: standalone health, the exporter collector, error policy per call."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from exporters.gpu.collector import GpuCollector, Scrape, gauge
from exporters.gpu.exporter_collector import GpuExporterCollector
from exporters.gpu.nvml import NvmlError
from exporters.gpu.sampler import Sampler
from tests.gpu.helpers import MakeRig, Scraped, SimRig, default_state


def ticking(step: float = 0.001) -> Iterator[float]:
    t = 0.0
    while True:
        yield t
        t += step


class Fixed(GpuCollector):
    """Reads one field per GPU; optionally raises a given NVML error on GPU 1."""

    name = "fixed"
    error: int | None = None

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        g = gauge("fixed_value", "test")
        for dev in scrape.devices():
            value = scrape.read(dev, self._read, dev.index)
            if value is not None:
                g.add_metric(dev.labels, value)
        yield g

    def _read(self, index: int) -> float:
        if index == 1 and self.error is not None:
            raise NvmlError(self.error, "nvmlDeviceGetFixed")
        return float(index + 10)


class Broken(GpuCollector):
    name = "broken"

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        yield gauge("broken_partial", "never reaches the scrape")
        raise RuntimeError("a bug")


def test_standalone_collector_reports_its_own_health(rig: SimRig, registry: CollectorRegistry) -> None:
    ticks = ticking()
    Fixed(rig.session, registry=registry, timer=lambda: next(ticks), clock=lambda: 1_700_000_000.0)
    assert (
        registry.get_sample_value("loadlens_gpu_fixed_value", {"gpu": "1", "uuid": rig_uuid(1), "model": MODEL}) == 11
    )
    assert registry.get_sample_value("loadlens_gpu_collector_success", {"collector": "fixed"}) == 1
    assert registry.get_sample_value("loadlens_gpu_collector_duration_seconds", {"collector": "fixed"}) == 0.001
    assert (
        registry.get_sample_value("loadlens_gpu_collector_last_success_timestamp_seconds", {"collector": "fixed"})
        == 1_700_000_000.0
    )


MODEL = "NVIDIA H100 80GB HBM3"


def rig_uuid(i: int) -> str:
    return f"GPU-5e1f0000-0000-4000-8000-{i:012x}"


def labels(i: int) -> dict[str, str]:
    return {"gpu": str(i), "uuid": rig_uuid(i), "model": MODEL}


@pytest.mark.parametrize(
    ("error", "success", "gpu1_value", "counted"),
    [
        (None, 1, 11.0, None),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, 1, None, None),  # absent, not 0, and not an error
        (pynvml.NVML_ERROR_NO_PERMISSION, 1, None, None),
        (pynvml.NVML_ERROR_UNKNOWN, 0, None, "Unknown"),  # collector fails, GPU 0 still reported
        (pynvml.NVML_ERROR_GPU_IS_LOST, 1, None, "GpuIsLost"),  # device down, collector fine
    ],
)
def test_error_policy(
    rig: SimRig,
    registry: CollectorRegistry,
    error: int | None,
    success: int,
    gpu1_value: float | None,
    counted: str | None,
) -> None:
    c = Fixed(rig.session)
    c.error = error
    GpuExporterCollector(rig.session, [c], registry=registry).sample()
    got = Scraped(registry)
    assert got.get("loadlens_gpu_fixed_value", labels(0)) == 10.0
    assert got.get("loadlens_gpu_fixed_value", labels(1)) == gpu1_value
    assert got.get("loadlens_gpu_collector_success", {"collector": "fixed"}) == success
    errors = got.series("loadlens_gpu_nvml_errors_total")
    assert errors == ({} if counted is None else {frozenset({("collector", "fixed"), ("error", counted)}): 1.0})
    lost = error == pynvml.NVML_ERROR_GPU_IS_LOST
    assert [up for _, up in rig.session.all_devices()] == [True, not lost]


def test_lifecycle_error_stops_the_scrape_and_marks_nvml_down(rig: SimRig, registry: CollectorRegistry) -> None:
    c = Fixed(rig.session)
    c.error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    GpuExporterCollector(rig.session, [c, Fixed(rig.session)], registry=registry).sample()
    text = generate_latest(registry).decode()
    assert 'loadlens_gpu_collector_success{collector="fixed"} 0.0' in text
    assert "loadlens_gpu_nvml_up 0.0" in text
    assert registry.get_sample_value(
        "loadlens_gpu_nvml_errors_total", {"collector": "fixed", "error": "DriverNotLoaded"}
    )


def test_a_broken_collector_does_not_fail_the_scrape(rig: SimRig, registry: CollectorRegistry) -> None:
    GpuExporterCollector(rig.session, [Broken(rig.session), Fixed(rig.session)], registry=registry).sample()
    text = generate_latest(registry).decode()
    assert "broken_partial" not in text
    assert registry.get_sample_value("loadlens_gpu_collector_success", {"collector": "broken"}) == 0
    assert registry.get_sample_value("loadlens_gpu_collector_success", {"collector": "fixed"}) == 1
    assert registry.get_sample_value("loadlens_gpu_fixed_value", labels(0)) == 10
    assert (
        registry.get_sample_value("loadlens_gpu_collector_last_success_timestamp_seconds", {"collector": "broken"})
        is None
    )


def test_zero_gpus_fails_every_collector(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(default_state().model_copy(update={"devices": []}))
    GpuExporterCollector(rig.session, [Fixed(rig.session)], registry=registry).sample()
    assert registry.get_sample_value("loadlens_gpu_collector_success", {"collector": "fixed"}) == 0
    assert registry.get_sample_value("loadlens_gpu_nvml_up") == 0
    assert registry.get_sample_value("loadlens_gpu_devices") == 0


def test_exporter_health_families(rig: SimRig, registry: CollectorRegistry) -> None:
    sampler = Sampler(rig.session, interval=0.1, window=30.0, clock=rig.clock)
    sampler.tick()
    ticks = ticking(0.002)
    GpuExporterCollector(
        rig.session, [Fixed(rig.session)], sampler=sampler, registry=registry, timer=lambda: next(ticks)
    ).sample()
    get = Scraped(registry).get
    assert get("loadlens_gpu_nvml_up") == 1
    assert get("loadlens_gpu_devices") == 2
    assert get("loadlens_gpu_nvml_init_failures_total") == 0
    assert get("loadlens_gpu_nvml_reinits_total") == 0
    assert get("loadlens_gpu_sampler_ticks_total") == 1
    assert get("loadlens_gpu_sampler_errors_total") == 0
    assert get("loadlens_gpu_sampler_interval_seconds") == 0.1
    assert get("loadlens_gpu_window_seconds") == 30.0
    # One scrape observed, 2 ms by the fake timer, into the 0.0025 bucket.
    assert get("loadlens_gpu_scrape_duration_seconds_count") == 1
    assert get("loadlens_gpu_scrape_duration_seconds_sum") == pytest.approx(0.002)
    assert get("loadlens_gpu_scrape_duration_seconds_bucket", {"le": "0.001"}) == 0
    assert get("loadlens_gpu_scrape_duration_seconds_bucket", {"le": "0.0025"}) == 1
    assert get("loadlens_gpu_scrape_duration_seconds_bucket", {"le": "+Inf"}) == 1
    generate_latest(registry)
    assert Scraped(registry).get("loadlens_gpu_scrape_duration_seconds_count") == 3  # each scrape counts itself


def test_registering_does_not_collect(rig: SimRig, registry: CollectorRegistry) -> None:
    GpuExporterCollector(rig.session, [Fixed(rig.session)], registry=registry)
    Fixed(rig.session, registry=CollectorRegistry())
    assert rig.sim.init_calls == 0
