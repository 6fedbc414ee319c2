"""Caching-allocator state per GPU as the sim engine models it (absent with the nvml backend).

On real GPUs the allocator lives inside the process that owns the memory; run
:class:`exporters.gpu.collectors.torch_allocator.TorchAllocatorCollector` there. Both emit the same
``loadlens_gpu_allocator_*`` series.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import Metric

from exporters.gpu.allocator import allocator_families, reading_from_state
from exporters.gpu.collector import GpuCollector, Scrape
from exporters.gpu.registration import BuildContext, register_collector
from loadlens.contracts.allocator_math import AllocatorReading


class AllocatorCollector(GpuCollector):
    """Source: the device-state document's ``allocator`` (sim); NotSupported (absent) on real NVML."""

    name = "allocator"

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        nvml = self.session.nvml
        readings: list[tuple[Sequence[str], AllocatorReading]] = []
        for dev in scrape.devices():
            state = scrape.read(dev, nvml.allocator_state, dev.handle)
            if state is not None:
                readings.append((dev.labels, reading_from_state(state)))
        yield from allocator_families(readings)


def _build(ctx: BuildContext) -> AllocatorCollector:
    return AllocatorCollector(ctx.session, timer=ctx.timer, clock=ctx.clock)


register_collector(AllocatorCollector.name, default=True, factory=_build)
