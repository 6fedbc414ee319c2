"""The load generator watching itself: a busy client delays its own timestamps, so its results are invalid.

``CpuMonitor`` samples this process's CPU once a second; ``CpuGuard`` marks the run invalid when the peak
(of any process) passes the threshold; ``CpuAccount`` charges CPU seconds to the stage window they were
spent in.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from typing import Any

import psutil

from loadgen.store import Store
from loadlens.contracts.slo import SLOConfig

DEFAULT_CPU_THRESHOLD = 0.9
CPU_WINDOW_S = 5
CPU_MIN_SAMPLES = 3
"""The guard judges a moving average of 3-5 one-second samples, so one busy second (spawning) cannot trip it."""


def cpu_threshold(flag: float, slos: SLOConfig) -> float:
    """``--cpu-threshold`` when given (non-zero), else the SLO file's ``alerting.loadgen_cpu_ratio``, else 0.9."""
    alerting = getattr(slos, "alerting", None) or {}
    return flag or float(alerting.get("loadgen_cpu_ratio", DEFAULT_CPU_THRESHOLD))


def process_cpu_percent() -> Callable[[], float]:
    """This process's CPU percent since the previous call (100 = one core)."""
    proc = psutil.Process(os.getpid())
    proc.cpu_percent(None)  # the first call only sets the baseline
    return lambda: proc.cpu_percent(None)


class CpuMonitor:
    """This process's CPU, sampled every second, averaged over 5 s (1.0 = one core)."""

    def __init__(self, read_percent: Callable[[], float] | None = None) -> None:
        self.read_percent = read_percent or process_cpu_percent()
        self.samples: collections.deque[float] = collections.deque(maxlen=CPU_WINDOW_S)
        self.current = 0.0
        self.peak = 0.0
        self.total = 0.0
        self.count = 0
        self.active = False  # only samples taken while a test runs count towards peak and mean

    def sample(self) -> None:
        self.samples.append(self.read_percent() / 100.0)
        self.current = sum(self.samples) / len(self.samples)
        if self.active and len(self.samples) >= CPU_MIN_SAMPLES:
            self.peak = max(self.peak, self.current)
            self.total += self.samples[-1]
            self.count += 1

    def reset(self) -> None:
        self.peak = self.total = 0.0
        self.count = 0

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


class CpuGuard:
    """Results stay valid while the load generator's CPU peak is at most ``threshold`` (1 = one core)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.valid = True
        self.reasons: list[str] = []

    def reset(self) -> None:
        self.valid = True
        self.reasons = []

    def check(self, peak: float) -> str | None:
        """The reason, the first time ``peak`` passes the threshold; None otherwise."""
        if peak <= self.threshold or not self.valid:
            return None
        self.valid = False
        reason = (
            f"load generator CPU reached {peak:.0%} of a core (threshold {self.threshold:.0%}): "
            "timestamps are delayed by the client itself"
        )
        self.reasons.append(reason)
        return reason

    def validity(self, cpu_peak: float, cpu_mean: float) -> dict[str, Any]:
        """The ``validity`` block of benchmark_result.json."""
        return {
            "results_valid": self.valid,
            "reasons": self.reasons,
            "loadgen_cpu_peak_ratio": round(cpu_peak, 4),
            "loadgen_cpu_mean_ratio": round(cpu_mean, 4),
            "cpu_threshold_ratio": self.threshold,
        }


class CpuAccount:
    """Charges this process's CPU time since the last charge to a window (``store.cpu_seconds``)."""

    def __init__(self, clock: Callable[[], float] = time.process_time) -> None:
        self.clock = clock
        self.mark = clock()

    def restart(self) -> None:
        self.mark = self.clock()

    def charge(self, store: Store, window: str) -> None:
        now = self.clock()
        store.cpu_seconds[window] += now - self.mark
        self.mark = now
