"""Power, energy, temperatures and clocks."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporters.gpu.collector import GpuCollector, Scrape, counter, gauge
from exporters.gpu.registration import BuildContext, register_collector


class PowerCollector(GpuCollector):
    """Sources: nvmlDeviceGetPowerUsage (mW), nvmlDeviceGetEnforcedPowerLimit (mW),
    nvmlDeviceGetTotalEnergyConsumption (mJ), nvmlDeviceGetTemperature, nvmlDeviceGetFieldValues
    (NVML_FI_DEV_MEMORY_TEMP), nvmlDeviceGetClockInfo / nvmlDeviceGetMaxClockInfo (MHz)."""

    name = "power"

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        nvml = self.session.nvml
        fields = (
            (gauge("power_watts", "Power draw of the board."), nvml.power_watts),
            (gauge("power_limit_watts", "Enforced power limit."), nvml.power_limit_watts),
            (counter("energy_joules", "Energy consumed since the driver was loaded."), nvml.energy_joules),
            (gauge("temperature_celsius", "GPU die temperature."), nvml.temperature_celsius),
            (gauge("memory_temperature_celsius", "HBM temperature."), nvml.memory_temperature_celsius),
            (gauge("sm_clock_hz", "Current SM clock."), nvml.sm_clock_hz),
            (gauge("memory_clock_hz", "Current memory clock."), nvml.memory_clock_hz),
            (gauge("sm_clock_max_hz", "Maximum SM clock."), nvml.max_sm_clock_hz),
        )
        for dev in scrape.devices():
            for family, read in fields:
                value = scrape.read(dev, read, dev.handle)
                if value is not None:
                    family.add_metric(dev.labels, value)
        for family, _ in fields:
            yield family


def _build(ctx: BuildContext) -> PowerCollector:
    return PowerCollector(ctx.session, timer=ctx.timer, clock=ctx.clock)


register_collector(PowerCollector.name, default=True, factory=_build)
