"""Device identity and health: ``loadlens_gpu_info`` and ``loadlens_gpu_device_up``."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import InfoMetricFamily, Metric

from exporters.gpu.collector import PREFIX, GpuCollector, Scrape, gauge
from exporters.gpu.registration import BuildContext, register_collector


class DeviceCollector(GpuCollector):
    """One info series per enumerated GPU (lost ones too, with their last known identity) and its up state.

    Sources: nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlDeviceGetPciInfo, nvmlSystemGetDriverVersion,
    nvmlSystemGetCudaDriverVersion (read at NVML initialisation).
    """

    name = "device"

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        scrape.devices()  # initialises NVML if needed; zero GPUs fails this collector
        session = self.session
        info = InfoMetricFamily(
            f"{PREFIX}",
            "GPU identity; join on uuid. Value is always 1.",
            labels=["gpu", "uuid", "model", "pci_bus_id", "driver_version", "cuda_driver_version"],
        )
        up = gauge("device_up", "1 if the GPU answers NVML calls, 0 if it is lost (fallen off the bus).")
        for dev, is_up in session.all_devices():
            info.add_metric(
                [
                    str(dev.index),
                    dev.uuid,
                    dev.model,
                    dev.pci_bus_id,
                    session.driver_version,
                    session.cuda_driver_version,
                ],
                {},
            )
            up.add_metric(dev.labels, 1.0 if is_up else 0.0)
        yield info
        yield up


def _build(ctx: BuildContext) -> DeviceCollector:
    return DeviceCollector(ctx.session, timer=ctx.timer, clock=ctx.clock)


register_collector(DeviceCollector.name, default=True, factory=_build)
