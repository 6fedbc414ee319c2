"""Clock-event (throttle) reasons, one series per reason."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporters.gpu.collector import DEVICE_LABELS, GpuCollector, Scrape, gauge
from exporters.gpu.nvml import CLOCK_EVENT_REASONS
from exporters.gpu.registration import BuildContext, register_collector


class ClockEventsCollector(GpuCollector):
    """Sources: nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetSupportedClocksEventReasons (bit masks).

    Reasons the GPU does not support are absent; supported ones are 0 or 1.
    """

    name = "clock_events"

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        nvml = self.session.nvml
        active = gauge(
            "clock_event_active",
            "1 while the reason holds clocks down (e.g. sw_power_cap, hw_thermal_slowdown), else 0.",
            [*DEVICE_LABELS, "reason"],
        )
        for dev in scrape.devices():
            current = scrape.read(dev, nvml.clock_event_reasons, dev.handle)
            if current is None:
                continue
            supported = scrape.read(dev, nvml.supported_clock_event_reasons, dev.handle)
            for reason, bit in CLOCK_EVENT_REASONS:
                if supported is not None and not supported & bit:
                    continue
                active.add_metric([*dev.labels, reason], 1.0 if current & bit else 0.0)
        yield active


def _build(ctx: BuildContext) -> ClockEventsCollector:
    return ClockEventsCollector(ctx.session, timer=ctx.timer, clock=ctx.clock)


register_collector(ClockEventsCollector.name, default=True, factory=_build)
