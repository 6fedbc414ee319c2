"""One collector per concern. :data:`COLLECTORS` maps each ``--collectors`` name to its class."""

from __future__ import annotations

from exporters.gpu.collector import GpuCollector
from exporters.gpu.collectors.allocator import AllocatorCollector
from exporters.gpu.collectors.clock_events import ClockEventsCollector
from exporters.gpu.collectors.dcgm import DcgmCompatCollector
from exporters.gpu.collectors.device import DeviceCollector
from exporters.gpu.collectors.errors import ErrorsCollector
from exporters.gpu.collectors.memory import MemoryCollector
from exporters.gpu.collectors.pcie import PcieCollector
from exporters.gpu.collectors.power import PowerCollector
from exporters.gpu.collectors.processes import ProcessesCollector
from exporters.gpu.collectors.utilization import UtilizationCollector

COLLECTORS: dict[str, type[GpuCollector]] = {
    c.name: c
    for c in (
        DeviceCollector,
        UtilizationCollector,
        MemoryCollector,
        ProcessesCollector,
        PowerCollector,
        ClockEventsCollector,
        ErrorsCollector,
        AllocatorCollector,
        PcieCollector,
        DcgmCompatCollector,
    )
}

# Enabled unless --collectors says otherwise. pcie costs ~20 ms per direction per GPU; dcgm is --dcgm-compat.
DEFAULT_COLLECTORS: tuple[str, ...] = (
    "device",
    "utilization",
    "memory",
    "processes",
    "power",
    "clock_events",
    "errors",
    "allocator",
)

__all__ = ["COLLECTORS", "DEFAULT_COLLECTORS"]
