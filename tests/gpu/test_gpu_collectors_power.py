from __future__ import annotations

from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.power import PowerCollector
from tests.gpu.helpers import MakeRig, Scraped, SimRig

L0 = {"gpu": "0", "uuid": "GPU-5e1f0000-0000-4000-8000-000000000000", "model": "NVIDIA H100 80GB HBM3"}
L1 = {"gpu": "1", "uuid": "GPU-5e1f0000-0000-4000-8000-000000000001", "model": "NVIDIA H100 80GB HBM3"}


def test_power_thermal_clocks_in_base_units(rig: SimRig, registry: CollectorRegistry) -> None:
    PowerCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_power_watts", L0) == 412.5
    assert got.get("loadlens_gpu_power_limit_watts", L0) == 700.0
    assert got.get("loadlens_gpu_energy_joules_total", L0) == 123456.789
    assert got.get("loadlens_gpu_temperature_celsius", L0) == 61.0
    assert got.get("loadlens_gpu_memory_temperature_celsius", L0) == 68.0
    assert got.get("loadlens_gpu_sm_clock_hz", L0) == 1.755e9
    assert got.get("loadlens_gpu_memory_clock_hz", L0) == 2.619e9
    assert got.get("loadlens_gpu_sm_clock_max_hz", L0) == 1.98e9


def test_unsupported_fields_are_absent_not_zero(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:memory-temperature:1,unsupported:energy")
    PowerCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_memory_temperature_celsius", L1) is None
    assert got.get("loadlens_gpu_memory_temperature_celsius", L0) == 68.0
    assert got.series("loadlens_gpu_energy_joules_total") == {}
    assert got.get("loadlens_gpu_power_watts", L1) == 412.5
    assert got.get("loadlens_gpu_collector_success", {"collector": "power"}) == 1
