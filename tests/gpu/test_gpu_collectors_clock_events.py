from __future__ import annotations

from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.clock_events import ClockEventsCollector
from exporters.gpu.nvml import CLOCK_EVENT_REASONS
from tests.gpu.helpers import MakeRig, Scraped, SimRig

UUID = "GPU-5e1f0000-0000-4000-8000-{:012x}"


def reasons(got: Scraped, gpu: int) -> dict[str, float]:
    return {
        dict(k)["reason"]: v
        for k, v in got.series("loadlens_gpu_clock_event_active").items()
        if ("gpu", str(gpu)) in k and ("uuid", UUID.format(gpu)) in k
    }


def test_one_series_per_reason(rig: SimRig, registry: CollectorRegistry) -> None:
    ClockEventsCollector(rig.session, registry=registry)
    got = Scraped(registry)
    all_zero = {name: 0.0 for name, _ in CLOCK_EVENT_REASONS}
    assert reasons(got, 0) == all_zero
    assert reasons(got, 1) == {**all_zero, "sw_power_cap": 1.0}


def test_unsupported_reasons_are_absent(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:clock-events:1")
    ClockEventsCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert reasons(got, 1) == {}
    assert len(reasons(got, 0)) == len(CLOCK_EVENT_REASONS)
