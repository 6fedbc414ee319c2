"""The CPU guard: moving average, peak and mean only while active, the invalidation reason, CPU accounting."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from loadgen.cpu_guard import CpuAccount, CpuGuard, CpuMonitor, cpu_threshold
from loadgen.metrics import bucket_bounds
from loadgen.store import Store
from loadlens.contracts.slo import load_slos


def reader(values: list[float]) -> Iterator[float]:
    yield from values


def monitor(values: list[float]) -> CpuMonitor:
    it = reader(values)
    return CpuMonitor(read_percent=lambda: next(it))


def test_current_is_a_five_second_moving_average() -> None:
    cpu = monitor([100, 0, 50, 50, 50, 100])
    for _ in range(5):
        cpu.sample()
    assert cpu.current == pytest.approx(0.5)
    cpu.sample()  # the first 100 % second drops out of the window
    assert cpu.current == pytest.approx(0.5)
    assert list(cpu.samples) == [0.0, 0.5, 0.5, 0.5, 1.0]


def test_peak_and_mean_count_only_active_samples_after_three() -> None:
    cpu = monitor([90, 90, 90, 0, 30, 30, 30])
    cpu.sample()  # inactive: not counted
    cpu.active = True
    cpu.sample()
    assert (cpu.peak, cpu.count) == (0.0, 0)  # 2 samples: one busy second cannot trip the guard
    cpu.sample()
    assert cpu.peak == pytest.approx(0.9) and cpu.count == 1 and cpu.mean == pytest.approx(0.9)
    cpu.sample()
    assert cpu.peak == pytest.approx(0.9) and cpu.mean == pytest.approx(0.45)
    cpu.reset()
    assert (cpu.peak, cpu.total, cpu.count, cpu.mean) == (0.0, 0.0, 0, 0.0)


def test_guard_invalidates_once_with_the_reason() -> None:
    guard = CpuGuard(0.9)
    assert guard.check(0.9) is None and guard.valid
    reason = guard.check(0.95)
    assert reason == (
        "load generator CPU reached 95% of a core (threshold 90%): timestamps are delayed by the client itself"
    )
    assert guard.check(1.5) is None  # reported once
    assert (guard.valid, guard.reasons) == (False, [reason])
    assert guard.validity(0.951234, 0.41) == {
        "results_valid": False,
        "reasons": [reason],
        "loadgen_cpu_peak_ratio": 0.9512,
        "loadgen_cpu_mean_ratio": 0.41,
        "cpu_threshold_ratio": 0.9,
    }
    guard.reset()
    assert (guard.valid, guard.reasons) == (True, [])


def test_threshold_flag_then_slo_file_then_default() -> None:
    slos = load_slos(None)
    assert cpu_threshold(0.5, replace(slos, alerting={"loadgen_cpu_ratio": 0.7})) == 0.5
    assert cpu_threshold(0.0, replace(slos, alerting={"loadgen_cpu_ratio": 0.7})) == 0.7
    assert cpu_threshold(0.0, replace(slos, alerting={})) == 0.9


def test_cpu_account_charges_the_window_since_the_last_charge() -> None:
    ticks = iter([10.0, 10.5, 11.25, 20.0, 20.5])
    account = CpuAccount(clock=lambda: next(ticks))
    store = Store(bucket_bounds(load_slos(None)))
    account.charge(store, "s1")
    account.charge(store, "s1")
    account.restart()  # a new run: what was spent before it is nobody's
    account.charge(store, "(drain)")
    assert dict(store.cpu_seconds) == {"s1": 1.25, "(drain)": 0.5}
