"""Device memory: capacity, use, the driver reservation, fluctuation and step growth over the window."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import Metric

from exporters.gpu.collector import DEVICE_LABELS, GpuCollector, Scrape, counter, gauge
from exporters.gpu.registration import BuildContext, register_collector
from exporters.gpu.sampler import Sampler
from exporters.gpu.session import Session


class MemoryCollector(GpuCollector):
    """Sources: nvmlDeviceGetMemoryInfo (v2, v1 fallback); the sampler's per-tick readings (window, steps);
    the sim's memory-by-owner breakdown (sim backend only)."""

    name = "memory"

    def __init__(self, session: Session, *, sampler: Sampler | None = None, **kwargs: Any) -> None:
        self._sampler = sampler
        super().__init__(session, **kwargs)

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        nvml = self.session.nvml
        total = gauge("memory_total_bytes", "Total device memory.")
        used = gauge("memory_used_bytes", "Device memory in use by allocations (v1 fallback: includes reserved).")
        free = gauge("memory_free_bytes", "Device memory free for allocation.")
        reserved = gauge("memory_reserved_bytes", "Device memory reserved by the driver and firmware (info v2).")
        owners = gauge(
            "memory_owner_bytes",
            "Device memory by owner (simulator only: weights, kv_cache, activations, adapters, ...).",
            [*DEVICE_LABELS, "owner"],
        )
        wmin = gauge("memory_used_window_min_bytes", "Lowest used memory in the window.")
        wmax = gauge("memory_used_window_max_bytes", "Highest used memory in the window (peak VRAM).")
        fluct = gauge("memory_fluctuation_ratio", "(max - min) / mean of used memory over the window.")
        steps = counter("memory_step_increases", "Step rises in used memory (a run of rises >= the step size).")
        step_bytes = counter("memory_step_increase_bytes", "Bytes added by step rises in used memory.")
        for dev in scrape.devices():
            mem = scrape.read(dev, nvml.memory, dev.handle)
            if mem is not None:
                total.add_metric(dev.labels, float(mem.total))
                used.add_metric(dev.labels, float(mem.used))
                free.add_metric(dev.labels, float(mem.free))
                if mem.reserved is not None:
                    reserved.add_metric(dev.labels, float(mem.reserved))
            by_owner = scrape.read(dev, nvml.memory_by_owner, dev.handle)
            for owner, value in sorted((by_owner or {}).items()):
                owners.add_metric([*dev.labels, owner], float(value))
            if self._sampler is None or scrape.skipped(dev):
                continue
            mw = self._sampler.memory_window(dev.uuid)
            if mw is not None:
                wmin.add_metric(dev.labels, float(mw.min_bytes))
                wmax.add_metric(dev.labels, float(mw.max_bytes))
                if mw.fluctuation is not None:
                    fluct.add_metric(dev.labels, mw.fluctuation)
            w = self._sampler.window_for(dev.uuid)
            if w is not None:
                steps.add_metric(dev.labels, float(w.step_count))
                step_bytes.add_metric(dev.labels, float(w.step_bytes))
        yield from (total, used, free, reserved, owners)
        if self._sampler is not None:
            yield from (wmin, wmax, fluct, steps, step_bytes)


def _build(ctx: BuildContext) -> MemoryCollector:
    return MemoryCollector(ctx.session, sampler=ctx.sampler, timer=ctx.timer, clock=ctx.clock)


register_collector(MemoryCollector.name, default=True, factory=_build)
