"""Per-process GPU memory, attributed to process name and container / pod."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import Metric

from exporters.gpu.collector import DEVICE_LABELS, GpuCollector, Scrape, gauge
from exporters.gpu.nvml import ProcessMemory
from exporters.gpu.procinfo import ProcessResolver
from exporters.gpu.registration import BuildContext, register_collector
from exporters.gpu.session import Session

OVERFLOW = "other"
PROCESS_LABELS = (*DEVICE_LABELS, "pid", "process_name", "container_id", "pod_uid")


class ProcessesCollector(GpuCollector):
    """Sources: nvmlDeviceGetComputeRunningProcesses, nvmlSystemGetProcessName, /proc/<pid>/cgroup.

    At most ``max_processes`` series per GPU (largest first); the rest are summed under pid="other".
    """

    name = "processes"

    def __init__(
        self,
        session: Session,
        *,
        max_processes: int = 128,
        resolver: ProcessResolver | None = None,
        **kwargs: Any,
    ) -> None:
        self._max = max_processes
        self._resolver = ProcessResolver() if resolver is None else resolver
        super().__init__(session, **kwargs)

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        nvml = self.session.nvml
        count = gauge("processes", "Compute processes running on the GPU.")
        used = gauge("process_used_memory_bytes", "Device memory used by one process.", PROCESS_LABELS)
        live: set[int] = set()

        def name_of(pid: int) -> str | None:
            return scrape.read(None, nvml.process_name, pid)

        for dev in scrape.devices():
            procs = scrape.read(dev, nvml.processes, dev.handle)
            if procs is None:
                continue
            dev_labels = dev.labels
            count.add_metric(dev_labels, float(len(procs)))
            kept: list[ProcessMemory] = procs
            rest: list[ProcessMemory] = []
            if len(procs) > self._max:
                ordered = sorted(procs, key=lambda p: (-(p.used_bytes or 0), p.pid))
                kept, rest = ordered[: self._max], ordered[self._max :]
            add = used.add_metric
            labels_of = self._resolver.labels
            for pid, used_bytes in kept:
                if used_bytes is not None:  # None under WDDM: NVML cannot attribute memory to processes
                    add([*dev_labels, str(pid), *labels_of(pid, name_of)], float(used_bytes))
            live.update(p.pid for p in kept)
            if rest:
                total = sum(p.used_bytes or 0 for p in rest)
                used.add_metric([*dev_labels, OVERFLOW, OVERFLOW, "", ""], float(total))
        self._resolver.prune(live)
        yield count
        yield used


def _build(ctx: BuildContext) -> ProcessesCollector:
    return ProcessesCollector(
        ctx.session,
        max_processes=ctx.max_processes,
        resolver=ProcessResolver(ctx.proc_root),
        timer=ctx.timer,
        clock=ctx.clock,
    )


register_collector(ProcessesCollector.name, default=True, factory=_build)
