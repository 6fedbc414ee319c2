"""DCGM-compatible aliases (``--dcgm-compat``) so dashboards built for dcgm-exporter work unchanged.

These names break loadlens naming on purpose (DCGM's units: percent, MiB, MHz) and carry dcgm-exporter's
labels: ``gpu``, ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<N>``), ``modelName``, ``hostname``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from exporters.gpu.collector import GpuCollector, Scrape
from exporters.gpu.nvml import MIB
from exporters.gpu.registration import BuildContext, register_collector
from exporters.gpu.session import Session

DCGM_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname"]


def _family(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=DCGM_LABELS)


class DcgmCompatCollector(GpuCollector):
    """Sources: nvmlDeviceGetUtilizationRates, nvmlDeviceGetMemoryInfo, nvmlDeviceGetPowerUsage,
    nvmlDeviceGetTemperature, nvmlDeviceGetClockInfo - the same reads as the native collectors."""

    name = "dcgm"

    def __init__(self, session: Session, *, hostname: str | None = None, **kwargs: Any) -> None:
        self._hostname = socket.gethostname() if hostname is None else hostname
        super().__init__(session, **kwargs)

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        nvml = self.session.nvml
        util = _family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")
        fb_used = _family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")
        fb_free = _family("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")
        power = _family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).")
        temp = _family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).")
        sm_clock = _family("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).")
        for dev in scrape.devices():
            labels = [str(dev.index), dev.uuid, dev.pci_bus_id, f"nvidia{dev.index}", dev.model, self._hostname]
            rates = scrape.read(dev, nvml.utilization, dev.handle)
            if rates is not None:
                util.add_metric(labels, round(rates[0] * 100.0, 6))
            mem = scrape.read(dev, nvml.memory, dev.handle)
            if mem is not None:
                fb_used.add_metric(labels, float(mem.used // MIB))  # DCGM reports whole MiB
                fb_free.add_metric(labels, float(mem.free // MIB))
            watts = scrape.read(dev, nvml.power_watts, dev.handle)
            if watts is not None:
                power.add_metric(labels, watts)
            celsius = scrape.read(dev, nvml.temperature_celsius, dev.handle)
            if celsius is not None:
                temp.add_metric(labels, celsius)
            hz = scrape.read(dev, nvml.sm_clock_hz, dev.handle)
            if hz is not None:
                sm_clock.add_metric(labels, hz / 1e6)
        yield from (util, fb_used, fb_free, power, temp, sm_clock)


def _build(ctx: BuildContext) -> DcgmCompatCollector:
    return DcgmCompatCollector(ctx.session, hostname=ctx.hostname, timer=ctx.timer, clock=ctx.clock)


register_collector(DcgmCompatCollector.name, default=False, factory=_build)  # --dcgm-compat or --collectors dcgm
