from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.utilization import UtilizationCollector
from exporters.gpu.sampler import Sampler
from tests.gpu.helpers import MakeRig, Scraped, SimRig

L0 = {"gpu": "0", "uuid": "GPU-5e1f0000-0000-4000-8000-000000000000", "model": "NVIDIA H100 80GB HBM3"}


def test_instant_and_window(rig: SimRig, registry: CollectorRegistry) -> None:
    sampler = Sampler(rig.session, window=30.0, clock=rig.clock)
    sampler.tick()
    UtilizationCollector(rig.session, sampler=sampler, registry=registry)
    got = Scraped(registry)
    # Last sample of the example square wave is 62 %; memory busy 41 %.
    assert got.get("loadlens_gpu_utilization_ratio", L0) == 0.62
    assert got.get("loadlens_gpu_memory_busy_ratio", L0) == 0.41
    expected = {
        "mean": 0.68,
        "min": 0.62,
        "max": 0.74,
        "p5": 0.62,
        "p95": 0.74,
        "stddev": 0.06,
        "peak_to_trough": 0.12,
    }
    for key, value in expected.items():
        assert got.get(f"loadlens_gpu_utilization_window_{key}_ratio", L0) == pytest.approx(value), key
    assert got.get("loadlens_gpu_utilization_swing_period_seconds", L0) == pytest.approx(0.6)
    assert got.get("loadlens_gpu_utilization_sample_interval_seconds", L0) == pytest.approx(0.1)
    assert got.get("loadlens_gpu_utilization_window_samples", L0) == 60
    assert got.get("loadlens_gpu_collector_success", {"collector": "utilization"}) == 1


def test_without_sampler_only_instant(rig: SimRig, registry: CollectorRegistry) -> None:
    UtilizationCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_utilization_ratio", L0) == 0.62
    assert not any(n.startswith("loadlens_gpu_utilization_window") for n in got.names)


def test_no_samples_yet_means_absent_window(rig: SimRig, registry: CollectorRegistry) -> None:
    sampler = Sampler(rig.session, clock=rig.clock)  # never ticked
    UtilizationCollector(rig.session, sampler=sampler, registry=registry)
    got = Scraped(registry)
    assert got.series("loadlens_gpu_utilization_window_mean_ratio") == {}
    assert got.get("loadlens_gpu_utilization_ratio", L0) == 0.62


def test_flat_utilisation_has_no_period_series(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    from tests.gpu.sim_example import example_device, example_state

    state = example_state(1, 1, sample_interval=0.1)
    flat = example_device(0, low=50.0, high=50.0, sample_interval=0.1)
    rig = make_rig(state.model_copy(update={"devices": [flat]}))
    sampler = Sampler(rig.session, clock=rig.clock)
    sampler.tick()
    UtilizationCollector(rig.session, sampler=sampler, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_utilization_window_stddev_ratio", L0) == 0.0
    assert got.series("loadlens_gpu_utilization_swing_period_seconds") == {}


def test_unsupported_rates_are_absent(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:utilization:0")
    UtilizationCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_utilization_ratio", L0) is None
    assert len(got.series("loadlens_gpu_utilization_ratio")) == 1
    assert got.get("loadlens_gpu_collector_success", {"collector": "utilization"}) == 1
