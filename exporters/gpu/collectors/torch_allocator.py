"""In-process PyTorch caching-allocator collector, for the process that owns the GPU memory.

Register it in a vLLM worker or a training loop; it reads ``torch.cuda.memory_stats(device)`` and
``torch.cuda.memory_snapshot()`` at each scrape::

    from exporters.gpu.collectors.torch_allocator import TorchAllocatorCollector
    TorchAllocatorCollector()                          # default REGISTRY, real torch
    TorchAllocatorCollector(torch=fake, registry=reg)  # tests

With torch absent, CUDA unavailable, or CUDA not yet initialised in this process (reading stats must not
create a CUDA context) it yields nothing and never raises. ``gpu`` is the CUDA device index, which differs
from NVML's index under ``CUDA_VISIBLE_DEVICES``: join with the exporter's series on ``uuid``.
``memory_snapshot()`` walks every block; pass ``snapshot=False`` to skip it when blocks number in the
hundreds of thousands (the largest-free-block and fragmentation series are then absent).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from exporters.gpu.allocator import allocator_families
from exporters.gpu.collector import PREFIX
from loadlens.contracts.allocator_math import AllocatorReading, reading_from_torch
from loadlens.util.cuda_device import device_uuid

log = logging.getLogger(__name__)

_UNSET: Any = object()


class TorchAllocatorCollector(Collector):
    name = "torch_allocator"

    def __init__(
        self,
        torch: Any = None,
        *,
        registry: CollectorRegistry | None = REGISTRY,
        snapshot: bool = True,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._torch: Any = _UNSET if torch is None else torch
        self._snapshot = snapshot
        self._timer = timer
        if registry:
            registry.register(self)

    def describe(self) -> list[Metric]:
        return []

    def _cuda(self) -> Any:
        if self._torch is _UNSET:
            try:
                self._torch = importlib.import_module("torch")
            except Exception as err:  # ImportError, or a broken CUDA install raising OSError
                log.debug("torch unavailable: %s", err)
                self._torch = None
        cuda = getattr(self._torch, "cuda", None)
        if cuda is None or not cuda.is_available() or not cuda.is_initialized():
            return None
        return cuda

    def _readings(self, cuda: Any) -> list[tuple[list[str], AllocatorReading]]:
        snapshot = cuda.memory_snapshot() if self._snapshot else None
        readings = []
        for i in range(int(cuda.device_count())):
            labels = [str(i), device_uuid(cuda, i), str(cuda.get_device_name(i))]
            readings.append((labels, reading_from_torch(cuda.memory_stats(i), snapshot, device=i)))
        return readings

    def collect(self) -> Iterator[Metric]:
        start = self._timer()
        try:
            cuda = self._cuda()
            if cuda is None:
                return
            families = list(allocator_families(self._readings(cuda)))
            ok = True
        except Exception:
            log.exception("torch allocator collector failed")
            families, ok = [], False
        yield from families
        success = GaugeMetricFamily(
            f"{PREFIX}_collector_success", "1 if the collector's last run succeeded, else 0.", labels=["collector"]
        )
        success.add_metric([self.name], 1.0 if ok else 0.0)
        duration = GaugeMetricFamily(
            f"{PREFIX}_collector_duration_seconds", "Duration of the collector's last run.", labels=["collector"]
        )
        duration.add_metric([self.name], self._timer() - start)
        yield success
        yield duration
