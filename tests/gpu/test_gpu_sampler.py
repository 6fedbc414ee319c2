"""The sampler: every driver sample at native rate, memory readings, steps, XID events, robustness."""

from __future__ import annotations

import time
from typing import Any

import pytest

from exporters.gpu.sampler import MAX_XID_CODES, XID_OTHER, Sampler
from loadlens.contracts.device_state import DeviceState, UtilSample
from tests.gpu.helpers import MakeRig, SimRig, default_state
from tests.gpu.sim_example import EXAMPLE_NOW_US, MIB

UUID0 = "GPU-5e1f0000-0000-4000-8000-000000000000"
UUID1 = "GPU-5e1f0000-0000-4000-8000-000000000001"


def with_device0(state: DeviceState, **update: object) -> DeviceState:
    devices = list(state.devices)
    devices[0] = devices[0].model_copy(update=update)
    return state.model_copy(update={"devices": devices})


def test_tick_reads_all_samples_and_memory(rig: SimRig) -> None:
    sampler = Sampler(rig.session, window=30.0, clock=rig.clock)
    sampler.tick()
    stats = sampler.util_stats(UUID0)
    assert stats is not None
    # example_state: 60 samples, 3 high (74 %) / 3 low (62 %), every 0.1 s.
    assert stats.samples == 60
    assert stats.mean == pytest.approx(0.68)
    assert stats.peak_to_trough == pytest.approx(0.12)
    assert stats.swing_period == pytest.approx(0.6)
    assert stats.sample_interval == pytest.approx(0.1)
    mw = sampler.memory_window(UUID0)
    assert mw is not None
    assert mw.min_bytes == mw.max_bytes == rig.source.state.devices[0].memory_used_bytes
    assert mw.fluctuation == 0.0
    assert sampler.ticks_total == 1 and sampler.errors_total == 0


def test_window_is_anchored_at_newest_sample(rig: SimRig) -> None:
    sampler = Sampler(rig.session, window=2.0, clock=rig.clock)
    sampler.tick()
    stats = sampler.util_stats(UUID0)
    assert stats is not None
    assert stats.samples == 21  # samples within the last 2.0 s, both ends included


def test_stats_follow_new_samples_at_most_every_stats_every(rig: SimRig) -> None:
    sampler = Sampler(rig.session, window=30.0, stats_every=1.0, clock=rig.clock)
    sampler.tick()
    first = sampler.util_stats(UUID0)
    assert first is not None and first.samples == 60
    newer = [UtilSample(timestamp_us=EXAMPLE_NOW_US + 100_000, gpu_percent=100.0)]
    rig.set_state(with_device0(rig.source.state, util_samples=newer))
    sampler.tick()
    assert sampler.util_stats(UUID0) is first  # new sample held, statistics not due yet
    rig.clock.advance(1.0)
    sampler.tick()
    stats = sampler.util_stats(UUID0)
    assert stats is not None and stats.samples == 61 and stats.max == 1.0
    rig.clock.advance(1.0)
    sampler.tick()
    assert sampler.util_stats(UUID0) is stats  # nothing new: not recomputed


def test_memory_fluctuation_and_steps(rig: SimRig) -> None:
    sampler = Sampler(rig.session, window=30.0, step_bytes=2 * MIB, clock=rig.clock)
    base = rig.source.state
    used0 = base.devices[0].memory_used_bytes
    # Three adapters load, 64 x 2 MiB each, one sampler tick apart; then a plateau.
    for used in (
        used0,
        used0,
        used0 + 128 * MIB,
        used0 + 256 * MIB,
        used0 + 256 * MIB,
        used0 + 384 * MIB,
        used0 + 384 * MIB,
    ):
        rig.set_state(with_device0(base, memory_used_bytes=used))
        sampler.tick()
        rig.clock.advance(0.1)
    w = sampler.window_for(UUID0)
    assert w is not None
    assert (w.step_count, w.step_bytes) == (2, 384 * MIB)  # 0->256 MiB over two ticks is one step
    mw = sampler.memory_window(UUID0)
    assert mw is not None
    assert (mw.min_bytes, mw.max_bytes) == (used0, used0 + 384 * MIB)
    mean = (2 * used0 + (used0 + 128 * MIB) + 2 * (used0 + 256 * MIB) + 2 * (used0 + 384 * MIB)) / 7
    assert mw.fluctuation == pytest.approx(384 * MIB / mean)
    # Old readings leave the window.
    rig.clock.advance(30)
    sampler.tick()
    mw = sampler.memory_window(UUID0)
    assert mw is not None and mw.min_bytes == mw.max_bytes == used0 + 384 * MIB


def test_xid_events_are_counted(rig: SimRig) -> None:
    sampler = Sampler(rig.session, clock=rig.clock, wall=lambda: 1234.5)
    sampler.tick()
    rig.sim.inject_xid(1, 79)
    rig.sim.inject_xid(1, 79)
    rig.sim.inject_xid(1, 48)
    sampler.tick()
    w1, w0 = sampler.window_for(UUID1), sampler.window_for(UUID0)
    assert w1 is not None and w0 is not None
    assert (w1.xid_registered, w1.xid_total, w1.xid_counts, w1.xid_last_time) == (True, 3, {79: 2, 48: 1}, 1234.5)
    assert (w0.xid_total, w0.xid_counts) == (0, {})


def test_xid_codes_are_bounded(rig: SimRig) -> None:
    sampler = Sampler(rig.session, clock=rig.clock)
    sampler.tick()
    for code in range(MAX_XID_CODES + 3):
        rig.sim.inject_xid(0, 1000 + code)
    sampler.tick()
    w = sampler.window_for(UUID0)
    assert w is not None
    assert len(w.xid_counts) == MAX_XID_CODES + 1
    assert w.xid_counts[XID_OTHER] == 3


def test_xid_unsupported_leaves_registration_off(make_rig: MakeRig) -> None:
    rig = make_rig(faults="unsupported:xid:0")
    sampler = Sampler(rig.session, clock=rig.clock)
    sampler.tick()
    w0, w1 = sampler.window_for(UUID0), sampler.window_for(UUID1)
    assert w0 is not None and w1 is not None
    assert (w0.xid_registered, w1.xid_registered) == (False, True)
    assert sampler.errors_total == 0  # NotSupported is not an error


def test_lost_gpu_during_tick_keeps_the_other(make_rig: MakeRig) -> None:
    rig = make_rig(faults="lost:1@1")
    sampler = Sampler(rig.session, clock=rig.clock)
    sampler.tick()
    rig.clock.advance(1)
    rig.set_state(with_device0(rig.source.state, memory_used_bytes=rig.source.state.devices[0].memory_used_bytes + 1))
    sampler.tick()
    assert [d.index for d in rig.session.devices()] == [0]
    assert rig.session.errors_total[("sampler", "GpuIsLost")] == 1
    w0 = sampler.window_for(UUID0)
    assert w0 is not None and len(w0.memory) == 2


def test_unsupported_samples_leave_no_window(make_rig: MakeRig) -> None:
    rig = make_rig(faults="unsupported:samples")
    sampler = Sampler(rig.session, clock=rig.clock)
    sampler.tick()
    assert sampler.util_stats(UUID0) is None
    assert sampler.memory_window(UUID0) is not None
    assert sampler.errors_total == 0


def test_nvml_down_then_back(rig: SimRig) -> None:
    sampler = Sampler(rig.session, clock=rig.clock)
    sampler.tick()
    rig.source.fail = OSError("engine gone")
    rig.clock.advance(1)  # the cached document expires (max_age 0) and the fetch fails
    sampler.tick()
    assert not rig.session.up
    assert sampler.errors_total == 1
    rig.source.fail = None
    rig.clock.advance(1)
    sampler.tick()
    assert rig.session.up
    # A new NVML generation re-registers XID events.
    rig.sim.inject_xid(0, 31)
    sampler.tick()
    w0 = sampler.window_for(UUID0)
    assert w0 is not None and w0.xid_counts == {31: 1}


def test_thread_starts_ticks_and_stops(make_rig: MakeRig) -> None:
    rig = make_rig(default_state(n_gpus=1))
    sampler = Sampler(rig.session, interval=0.01)
    sampler.start()
    sampler.start()  # idempotent
    deadline = time.monotonic() + 30  # bounds a failure only: a loaded machine may take a while
    while sampler.ticks_total < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert sampler.ticks_total >= 3
    ticks = sampler.ticks_total
    time.sleep(0.05)
    assert sampler.ticks_total == ticks


def test_a_bug_in_a_tick_does_not_kill_the_thread(rig: SimRig, monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = Sampler(rig.session, interval=0.01)
    calls = {"n": 0}
    real_tick = sampler.tick

    def flaky(**kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        real_tick(**kwargs)

    monkeypatch.setattr(sampler, "tick", flaky)
    sampler.start()
    deadline = time.monotonic() + 30  # bounds a failure only: a loaded machine may take a while
    while calls["n"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert calls["n"] >= 3
    assert sampler.errors_total >= 1
