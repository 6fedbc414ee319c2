"""The sim's busy timeline: its step schedule as the same (start, end) intervals and figures a probe publishes
(docs/device-state.md, version 3: ``busy_intervals`` and ``busy``)."""

from __future__ import annotations

from typing import Any

import pytest

from exporters.serving.engines.sim import load_gpu_profile
from exporters.serving.engines.sim.device import SimulatedGPU
from exporters.serving.engines.sim.device_model import DeviceModel
from loadlens.contracts.device_state import DeviceState
from tests.sim.helpers import collect, make_engine, prompt_of, request, run


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_an_84_ms_step_schedule_comes_back_as_its_timeline_and_period() -> None:
    clock = Clock()
    dev = SimulatedGPU(load_gpu_profile("h100-sxm"), seed=1, clock=clock, realtime=lambda: 1_000.0)
    # 12 s (more than the 10 s window) of guide 2.2's one-task swing: kernels 57 ms of every 84 ms.
    steps = [(100.0 + k * 0.084, 100.0 + k * 0.084 + 0.057) for k in range(143)]
    for start, end in steps:
        dev.record_busy(start, end, memory_fraction=0.5, intensity=0.6)
    clock.t = steps[-1][1]
    snap = dev.snapshot()
    # Unix µs of each step of the last 10 s: realtime origin 1000 s at monotonic 100 s.
    assert [(iv.start_us, iv.end_us) for iv in snap.busy_intervals] == [
        (round((1_000.0 + s - 100.0) * 1e6), round((1_000.0 + e - 100.0) * 1e6)) for s, e in steps if e > clock.t - 10
    ]
    busy = snap.busy
    assert busy is not None
    assert (busy.source, busy.clock, busy.uuid, busy.cuda_index) == ("sim_step", "sim_schedule", dev.uuid, None)
    assert busy.intervals_total == 143 and busy.busy_seconds_total == pytest.approx(143 * 0.057)
    assert busy.period_seconds == pytest.approx(0.084, abs=0.001)
    assert busy.busy_run is not None and busy.busy_run.p50 == pytest.approx(0.057, abs=1e-6)
    assert busy.idle_gap is not None and busy.idle_gap.p50 == pytest.approx(0.027, abs=1e-6)
    assert busy.idle_gap_count == 142
    # since_us returns only the steps ending after it
    later = dev.snapshot(since_us=snap.busy_intervals[-2].end_us)
    assert [iv.end_us for iv in later.busy_intervals] == [snap.busy_intervals[-1].end_us]


def test_the_engines_document_holds_every_step_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's step schedule (each DeviceModel.record_step) is what /sim/device-state's timeline shows."""
    recorded: list[tuple[float, float]] = []
    original = DeviceModel.record_step

    def spy(self: DeviceModel, *args: Any, busy_start: float, end: float, **kwargs: Any) -> None:
        recorded.append((busy_start, end))
        original(self, *args, busy_start=busy_start, end=end, **kwargs)

    monkeypatch.setattr(DeviceModel, "record_step", spy)

    async def body() -> dict[str, Any]:
        engine, _ = make_engine(speed=50.0)
        await engine.start()
        try:
            await collect(await engine.generate(request("a", prompt_of(16), max_tokens=12)))
            doc = engine.device_state(0)
        finally:
            await engine.stop()
        return dict(doc)

    doc = DeviceState.model_validate(run(body()))
    dev = doc.devices[0]
    assert dev.busy is not None
    steps = [(iv.start_us, iv.end_us) for iv in dev.busy_intervals]
    kernels = [(s, e) for s, e in recorded if e > s]  # a step with no kernel time records nothing
    assert len(steps) == len(kernels) == dev.busy.intervals_total >= 12
    # Same lengths, in the same order (the document's are on the realtime clock, the engine's monotonic).
    assert [e - s for s, e in steps] == pytest.approx([(e - s) * 1e6 for s, e in kernels], abs=2)
    assert dev.busy.busy_seconds_total == pytest.approx(sum(e - s for s, e in kernels))
