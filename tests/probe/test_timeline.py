"""The busy timeline (exporters.probe.timeline): one interval per forward of a hooked ``nn.Module``, timed with
``perf_counter`` on the CPU and with CUDA events on a GPU, resolved without ever waiting for the device."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from exporters.probe.timeline import CLOCK_CUDA, CLOCK_HOST, BusyTimeline, hook_module
from tests.probe.fakes import FakeCuda, fake_torch, stats
from tests.support import required


class Clock:
    """A perf_counter the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cpu_module_records_one_interval_per_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = required.require_module("torch")

    def no_sync(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the hook synchronised")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    hook = hook_module(model, torch)
    assert hook.timeline.clock == CLOCK_HOST and hook.timeline.source == "module_forward"
    with torch.no_grad():
        for _ in range(5):
            model(torch.ones(3, 8))
    got = hook.timeline.intervals()
    assert len(got) == 5 and hook.timeline.recorded_total == 5
    assert all(end >= start for start, end in got)
    assert all(a[1] <= b[0] for a, b in zip(got, got[1:], strict=False))  # one after the other
    hook.remove()
    model(torch.ones(3, 8))
    assert len(hook.timeline.intervals()) == 5


def test_host_clock_intervals_are_unix_times_of_the_forward() -> None:
    clock = Clock()
    timeline = BusyTimeline(SimpleNamespace(), source="test", timer=clock, wall=lambda: 1_000.0)  # no torch.cuda
    token = timeline.begin()
    clock.now += 0.004
    timeline.end(token)
    assert timeline.intervals() == [(pytest.approx(1_000.0), pytest.approx(1_000.004))]
    assert timeline.busy_seconds_total == pytest.approx(0.004)


def test_cuda_events_resolve_later_and_never_wait() -> None:
    cuda = FakeCuda({0: stats(0, 0, 0)}, [])
    device = cuda.stream
    device.auto_complete = False
    clock = Clock()
    timeline = BusyTimeline(fake_torch(cuda), source="test", timer=clock, wall=lambda: 1_000.0)
    assert timeline.clock == CLOCK_CUDA and timeline.cuda_index == 0
    assert device.waits == 1  # the reference, at construction: the only wait (FakeCuda.synchronize raises)
    # The reference ran at host time 100.0 s (Unix 1000.0). Three forwards queued; the device has run none.
    spans = [(2.0, 5.0), (5.0, 9.5), (12.0, 13.0)]
    for start, end in spans:
        device.now_ms = start
        token = timeline.begin()
        device.now_ms = end
        timeline.end(token)
    assert timeline.pending == 3 and timeline.intervals() == []
    device.done_up_to = 4  # the reference and the first pair have run, the second pair only its start
    assert timeline.intervals() == [(pytest.approx(1_000.002), pytest.approx(1_000.005))]
    device.done_up_to = device.sequence
    got = timeline.intervals()
    assert [(round((s - 1_000.0) * 1e3, 6), round((e - 1_000.0) * 1e3, 6)) for s, e in got] == spans
    assert timeline.pending == 0 and device.waits == 1


def test_a_forward_that_raises_still_closes_its_interval() -> None:
    torch = required.require_module("torch")

    class Boom(torch.nn.Module):  # type: ignore[misc,name-defined]
        def forward(self, x: Any) -> Any:
            raise RuntimeError("boom")

    model = Boom()
    hook = hook_module(model, torch)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            model(torch.ones(1))
    assert len(hook.timeline.intervals()) == 2
