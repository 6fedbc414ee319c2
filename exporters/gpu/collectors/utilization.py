"""GPU utilisation: the instant value and rolling-window statistics from the sampler."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from exporters.gpu.busy import BusyFamilies
from exporters.gpu.collector import DEVICE_LABELS, GpuCollector, Scrape, gauge
from exporters.gpu.registration import BuildContext, register_collector
from exporters.gpu.sampler import Sampler
from exporters.gpu.session import Session

# (suffix, help) for each window statistic; values are ratios 0-1.
_WINDOW_STATS: tuple[tuple[str, str], ...] = (
    ("mean", "Mean utilisation over the window."),
    ("min", "Lowest utilisation sample in the window."),
    ("max", "Highest utilisation sample in the window."),
    ("p5", "5th percentile of utilisation samples in the window."),
    ("p95", "95th percentile of utilisation samples in the window."),
    ("stddev", "Population standard deviation of utilisation samples in the window."),
    ("peak_to_trough", "Utilisation swing over the window: p95 - p5."),
)


class UtilizationCollector(GpuCollector):
    """Sources: nvmlDeviceGetUtilizationRates (instant); nvmlDeviceGetSamples via the sampler (window); on the sim
    backend also the step schedule's busy timeline (``loadlens_gpu_busy_*``, exporters/gpu/busy.py; on a real GPU
    those come from the probe collector)."""

    name = "utilization"

    def __init__(self, session: Session, *, sampler: Sampler | None = None, **kwargs: Any) -> None:
        self._sampler = sampler
        super().__init__(session, **kwargs)

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        nvml = self.session.nvml
        util = gauge("utilization_ratio", "Share of the last sample period a kernel was running (0-1).")
        busy = gauge(
            "memory_busy_ratio",
            "Share of the last sample period device memory was read or written (0-1); not capacity.",
        )
        window: dict[str, GaugeMetricFamily] = {
            key: gauge(f"utilization_window_{key}_ratio", doc) for key, doc in _WINDOW_STATS
        }
        period = gauge(
            "utilization_swing_period_seconds",
            "Dominant utilisation swing period over the window; only meaningful above 2x the sample interval.",
        )
        interval = gauge(
            "utilization_sample_interval_seconds",
            "Effective interval between the driver's utilisation samples (median gap in the window).",
        )
        count = gauge("utilization_window_samples", "Utilisation samples in the window.")
        length = gauge(
            "utilization_window_seconds",
            "Length of the rolling window the window statistics cover (--window): a reader slicing a period out of "
            "them skips this much of its start, which still holds samples from before it.",
        )
        timeline = BusyFamilies(DEVICE_LABELS)
        for dev in scrape.devices():
            if self.session.backend == "sim":
                figures = scrape.read(dev, nvml.sim_busy, dev.handle)
                if figures is not None:
                    timeline.add(dev.labels, figures)
            rates = scrape.read(dev, nvml.utilization, dev.handle)
            if rates is not None:
                util.add_metric(dev.labels, rates[0])
                busy.add_metric(dev.labels, rates[1])
            if self._sampler is None or scrape.skipped(dev):
                continue
            stats = self._sampler.util_stats(dev.uuid)
            if stats is None:
                continue
            for key, _ in _WINDOW_STATS:
                window[key].add_metric(dev.labels, getattr(stats, key))
            if stats.swing_period is not None:
                period.add_metric(dev.labels, stats.swing_period)
            if stats.sample_interval is not None:
                interval.add_metric(dev.labels, stats.sample_interval)
            count.add_metric(dev.labels, float(stats.samples))
            length.add_metric(dev.labels, float(self._sampler.window))
        yield util
        yield busy
        yield from timeline.families()
        if self._sampler is not None:
            yield from window.values()
            yield period
            yield interval
            yield count
            yield length


def _build(ctx: BuildContext) -> UtilizationCollector:
    return UtilizationCollector(ctx.session, sampler=ctx.sampler, timer=ctx.timer, clock=ctx.clock)


register_collector(UtilizationCollector.name, default=True, factory=_build)
