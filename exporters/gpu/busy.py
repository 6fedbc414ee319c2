"""The busy timeline's series (issue 24 item 3): what a probe document's ``busy`` section (or the sim's step
timeline, ``exporters.gpu.sim``) says about millisecond-scale utilisation, beside NVML's coarse
``loadlens_gpu_utilization_*`` (one NVML sample averages about 1/6 s; these come from CUDA-event or
perf_counter intervals binned at 1 ms). docs/metrics.md lists each with its source and resolution."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import HistogramMetricFamily, Metric

from exporters.gpu.collector import PREFIX, counter, gauge

if TYPE_CHECKING:  # pydantic models: a lean install (nvml backend only) never builds one
    from loadlens.contracts.probe_document import ProbeBusy

STATS = ("p50", "p95", "max")


class BusyFamilies:
    """The ``loadlens_gpu_busy_*`` families over ``labels`` (the device's, plus the process's for a probe)."""

    def __init__(self, labels: Sequence[str]) -> None:
        lab = tuple(labels)
        self.info = gauge(
            "busy_info",
            "1 per busy timeline: what it times (source) and with which clock (cuda_event: device time; "
            "perf_counter: host time of a synchronous CPU step; sim_schedule: the sim's step schedule).",
            (*lab, "source", "clock"),
        )
        self.ratio = gauge("busy_ratio", "Share of the window the device was busy, from the busy timeline.", lab)
        self.swing = gauge(
            "busy_swing_ratio",
            "Peak-to-trough of the busy ratio: p95 - p5 over the window's swing bins (10 ms).",
            lab,
        )
        self.period = gauge(
            "busy_period_seconds",
            "Dominant period of the busy ratio in 1 ms bins (autocorrelation); absent when none (see "
            "loadlens_gpu_busy_period_missing).",
            lab,
        )
        self.missing = gauge(
            "busy_period_missing",
            "1 with the reason the window has no period: no_intervals, too_short, flat, below_nyquist, no_cycle.",
            (*lab, "reason"),
        )
        self.run = gauge("busy_window_run_seconds", "Busy-run length in the window, by statistic.", (*lab, "stat"))
        self.gap = gauge("busy_window_idle_gap_seconds", "Idle-gap length in the window, by statistic.", (*lab, "stat"))
        self.window = gauge("busy_window_seconds", "Length of the window the busy figures cover.", lab)
        self.resolution = gauge(
            "busy_resolution_seconds", "Bin width of the series the period is found in (the resolution).", lab
        )
        self.intervals = counter("busy_intervals", "Busy intervals recorded (forward passes, engine steps).", lab)
        self.seconds = counter("busy_seconds", "Summed length of the busy intervals recorded.", lab)
        self.gaps = HistogramMetricFamily(
            f"{PREFIX}_busy_idle_gap_seconds",
            "Idle gaps between busy runs since the timeline started.",
            labels=lab,
        )

    def add(self, labels: Sequence[str], busy: ProbeBusy) -> None:
        lab = list(labels)
        self.info.add_metric([*lab, busy.source, busy.clock], 1.0)
        self.ratio.add_metric(lab, busy.busy_ratio)
        if busy.swing_ratio is not None:
            self.swing.add_metric(lab, busy.swing_ratio)
        if busy.period_seconds is not None:
            self.period.add_metric(lab, busy.period_seconds)
        elif busy.period_reason is not None:
            self.missing.add_metric([*lab, busy.period_reason], 1.0)
        for fam, spread in ((self.run, busy.busy_run), (self.gap, busy.idle_gap)):
            if spread is not None:
                for stat in STATS:
                    fam.add_metric([*lab, stat], float(getattr(spread, stat)))
        self.window.add_metric(lab, busy.window_seconds)
        self.resolution.add_metric(lab, busy.resolution_seconds)
        self.intervals.add_metric(lab, float(busy.intervals_total))
        self.seconds.add_metric(lab, busy.busy_seconds_total)
        if busy.idle_gap_bounds and len(busy.idle_gap_bounds) == len(busy.idle_gap_counts):
            buckets = [
                (repr(float(b)), float(c)) for b, c in zip(busy.idle_gap_bounds, busy.idle_gap_counts, strict=True)
            ]
            buckets.append(("+Inf", float(busy.idle_gap_count)))
            self.gaps.add_metric(lab, buckets, busy.idle_gap_sum)

    def families(self) -> list[Metric]:
        """The families with at least one series (none at all where no timeline is recorded)."""
        every: list[Metric] = [
            self.info,
            self.ratio,
            self.swing,
            self.period,
            self.missing,
            self.run,
            self.gap,
            self.window,
            self.resolution,
            self.intervals,
            self.seconds,
            self.gaps,
        ]
        return [f for f in every if getattr(f, "rows", None) or f.samples]
