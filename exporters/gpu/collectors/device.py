"""Device identity and health: ``loadlens_gpu_info`` and ``loadlens_gpu_device_up``; and the datasheet peaks
MFU and MBU divide by (``loadlens_gpu_peak_flops_per_second``, ``loadlens_gpu_peak_memory_bytes_per_second``),
from the packaged GPU profile whose ``marketing_name`` is the device's NVML name: absent for a GPU without one,
and on the lean GPU-node install, which cannot read profiles."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import InfoMetricFamily, Metric

from exporters.gpu.collector import PREFIX, GpuCollector, Scrape, gauge
from exporters.gpu.registration import BuildContext, register_collector

if TYPE_CHECKING:
    from loadlens.contracts.gpu_profile import GPUProfile


@functools.cache
def _profile(model: str) -> GPUProfile | None:
    """The packaged profile for an NVML device name, read once per name (the profiles are packaged data).
    None on the lean GPU-node install (no pydantic to read profiles with): the peaks are then absent."""
    try:
        from loadlens.contracts.gpu_profile import profile_for_device
    except ImportError:
        return None
    return profile_for_device(model)


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
        peak_flops = gauge(
            "peak_flops_per_second",
            "Datasheet dense 16-bit tensor FLOP/s of the GPU (its packaged GPU profile's peak_tensor_flops); "
            "the denominator of MFU.",
        )
        peak_bytes = gauge(
            "peak_memory_bytes_per_second",
            "Datasheet HBM bandwidth of the GPU in bytes/s (its packaged GPU profile's hbm_bytes_per_s); the "
            "denominator of MBU.",
        )
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
            profile = _profile(dev.model)
            if profile is not None:
                peak_flops.add_metric(dev.labels, profile.peak_tensor_flops)
                peak_bytes.add_metric(dev.labels, profile.hbm_bytes_per_s)
        yield info
        yield up
        yield peak_flops
        yield peak_bytes


def _build(ctx: BuildContext) -> DeviceCollector:
    return DeviceCollector(ctx.session, timer=ctx.timer, clock=ctx.clock)


register_collector(DeviceCollector.name, default=True, factory=_build)
