"""The busy timeline end to end without a GPU: a probe whose timeline records a 29 ms on/off load (host clock,
driven by the test), its document's ``busy`` section, and the GPU exporter's ``loadlens_gpu_busy_*`` series
from it, beside NVML's coarse utilisation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporters.probe.probe import Probe
from loadlens.contracts.buckets import BUSY_IDLE_GAP_SECONDS
from tests.gpu.test_gpu_collectors_probe import NOW, exporter, scrape
from tests.probe.fakes import FakeCuda, fake_torch

US = 1e-6
"""Intervals are Unix seconds: a float near 1.8e9 holds them to about 0.24 µs."""


class Clocks:
    """The probe's wall clock and perf_counter, moved together by the test."""

    def __init__(self) -> None:
        self.t = 50.0

    def wall(self) -> float:
        return NOW - 60.0 + self.t

    def timer(self) -> float:
        return self.t


def test_a_probe_publishes_the_timeline_and_the_exporter_serves_it(tmp_path: Path) -> None:
    clocks = Clocks()
    cuda = FakeCuda({}, [], available=False)  # a CPU process: perf_counter timeline, no devices
    probe = Probe("trainer", tmp_path, fake_torch(cuda), clock=clocks.wall, timer=clocks.timer)
    timeline = probe.busy_timeline("module_forward")
    assert probe.busy_timeline("other") is timeline  # one per probe
    # 10 s of a 29 ms cycle: busy 13 ms, idle 16 ms; the window ends at the last one, about wall time NOW.
    start = clocks.t
    while clocks.t < start + 10.0:
        token = timeline.begin()
        clocks.t += 0.013
        timeline.end(token)
        clocks.t += 0.016
    doc = probe.document()
    busy = doc.busy
    assert busy is not None
    assert (busy.source, busy.clock, busy.cuda_index, busy.uuid) == ("module_forward", "perf_counter", None, "")
    assert busy.window_seconds == 10.0 and busy.resolution_seconds == 0.001 and busy.swing_bin_seconds == 0.01
    assert busy.period_seconds == pytest.approx(0.029, abs=0.001) and busy.period_reason is None
    assert busy.busy_ratio == pytest.approx(13 / 29, abs=0.01)
    assert busy.busy_run is not None and busy.busy_run.p50 == pytest.approx(0.013, abs=US)
    assert busy.idle_gap is not None and busy.idle_gap.max == pytest.approx(0.016, abs=US)
    n = busy.intervals_total
    assert n == 345 and busy.busy_seconds_total == pytest.approx(n * 0.013, abs=n * US)
    # Every gap is 16 ms: counted once each, in the 20 ms bucket and above.
    assert busy.idle_gap_count == n - 1 and busy.idle_gap_sum == pytest.approx((n - 1) * 0.016, abs=n * US)
    assert busy.idle_gap_bounds == list(BUSY_IDLE_GAP_SECONDS)
    assert busy.idle_gap_counts == [0 if b < 0.016 else n - 1 for b in BUSY_IDLE_GAP_SECONDS]
    assert probe.document().busy.idle_gap_count == n - 1  # type: ignore[union-attr]  # not counted twice

    probe.write_now()
    exp, _ = exporter(tmp_path, ["utilization", "probe"])
    got = scrape(exp)
    lab = {"gpu": "", "uuid": "", "model": "", "pid": str(os.getpid()), "role": "trainer"}
    key = frozenset(lab.items())
    assert got["loadlens_gpu_busy_info", key | {("source", "module_forward"), ("clock", "perf_counter")}] == 1
    assert got["loadlens_gpu_busy_ratio", key] == pytest.approx(busy.busy_ratio)
    assert got["loadlens_gpu_busy_swing_ratio", key] == busy.swing_ratio
    assert got["loadlens_gpu_busy_period_seconds", key] == pytest.approx(0.029, abs=0.001)
    assert not [k for k in got if k[0] == "loadlens_gpu_busy_period_missing" and "pid" in dict(k[1])]
    assert got["loadlens_gpu_busy_window_run_seconds", key | {("stat", "p50")}] == pytest.approx(0.013, abs=US)
    assert got["loadlens_gpu_busy_window_idle_gap_seconds", key | {("stat", "max")}] == pytest.approx(0.016, abs=US)
    assert got["loadlens_gpu_busy_intervals_total", key] == n
    assert got["loadlens_gpu_busy_idle_gap_seconds_count", key] == n - 1
    assert got["loadlens_gpu_busy_idle_gap_seconds_bucket", key | {("le", "0.015")}] == 0
    assert got["loadlens_gpu_busy_idle_gap_seconds_bucket", key | {("le", "0.02")}] == n - 1
    assert got["loadlens_gpu_busy_idle_gap_seconds_bucket", key | {("le", "+Inf")}] == n - 1
    # NVML's coarse utilisation is still there, under its own names.
    assert [k for k in got if k[0] == "loadlens_gpu_utilization_ratio"]


def test_an_idle_timeline_has_no_period_and_says_why(tmp_path: Path) -> None:
    clocks = Clocks()
    probe = Probe("trainer", tmp_path, fake_torch(FakeCuda({}, [], available=False)), clock=clocks.wall,
                  timer=clocks.timer)  # fmt: skip
    probe.busy_timeline("module_forward")
    probe.write_now()
    exp, _ = exporter(tmp_path, ["probe"])
    got = scrape(exp)
    key = frozenset({"gpu": "", "uuid": "", "model": "", "pid": str(os.getpid()), "role": "trainer"}.items())
    assert got["loadlens_gpu_busy_ratio", key] == 0.0
    assert got["loadlens_gpu_busy_period_missing", key | {("reason", "no_intervals")}] == 1
    assert not [k for k in got if k[0] == "loadlens_gpu_busy_period_seconds" and "pid" in dict(k[1])]
