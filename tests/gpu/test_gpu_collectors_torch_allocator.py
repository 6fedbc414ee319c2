"""The in-process torch allocator collector, against a fake ``torch.cuda`` shaped like the real one."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.torch_allocator import TorchAllocatorCollector
from loadlens.contracts.allocator_math import reading_from_torch
from tests.gpu.helpers import Scraped

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
MIB = 2**20


class FakeCuda:
    """torch.cuda's surface the collector uses: availability, devices, memory_stats, memory_snapshot."""

    def __init__(self, *, available: bool = True, initialized: bool = True, fail: bool = False) -> None:
        self._stats = json.loads((FIXTURES / "torch_memory_stats.json").read_text())
        self._snapshot = json.loads((FIXTURES / "torch_memory_snapshot.json").read_text())
        self._available, self._initialized, self._fail = available, initialized, fail
        self.snapshot_calls = 0

    def is_available(self) -> bool:
        return self._available

    def is_initialized(self) -> bool:
        return self._initialized

    def device_count(self) -> int:
        return 2

    def get_device_name(self, i: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def get_device_properties(self, i: int) -> Any:
        return SimpleNamespace(uuid=f"5e1f0000-0000-4000-8000-{i:012x}")

    def memory_stats(self, device: int) -> dict[str, int]:
        if self._fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return dict(self._stats[str(device)])

    def memory_snapshot(self) -> list[dict[str, Any]]:
        self.snapshot_calls += 1
        return list(self._snapshot)


def labels(i: int) -> dict[str, str]:
    return {"gpu": str(i), "uuid": f"GPU-5e1f0000-0000-4000-8000-{i:012x}", "model": "NVIDIA H100 80GB HBM3"}


def test_reads_stats_and_snapshot(registry: CollectorRegistry) -> None:
    cuda = FakeCuda()
    TorchAllocatorCollector(SimpleNamespace(cuda=cuda), registry=registry)
    got = Scraped(registry)
    assert cuda.snapshot_calls == 1  # once per scrape, for every device
    l0 = labels(0)
    assert got.get("loadlens_gpu_allocator_reserved_bytes", l0) == 22 * MIB
    assert got.get("loadlens_gpu_allocator_allocated_bytes", l0) == 9 * MIB
    assert got.get("loadlens_gpu_allocator_inactive_split_bytes", l0) == 13 * MIB
    assert got.get("loadlens_gpu_allocator_segments", l0) == 2
    assert got.get("loadlens_gpu_allocator_alloc_retries_total", l0) == 1
    # Inactive blocks of device 0: 4 MiB + 8 MiB (large segment) + 1 MiB (small segment).
    assert got.get("loadlens_gpu_allocator_free_bytes", l0) == 13 * MIB
    assert got.get("loadlens_gpu_allocator_largest_free_block_bytes", l0) == 8 * MIB
    assert got.get("loadlens_gpu_allocator_fragmentation_ratio", l0) == pytest.approx(1 - 8 / 13)
    assert got.get("loadlens_gpu_allocator_rounding_overhead_bytes", l0) == 9 * MIB - (4 * 1_258_291 + 1_000_000)
    # Device 1: one whole free segment is not fragmented.
    assert got.get("loadlens_gpu_allocator_fragmentation_ratio", labels(1)) == 0.0
    assert got.get("loadlens_gpu_allocator_ooms_total", labels(1)) == 2
    assert got.get("loadlens_gpu_collector_success", {"collector": "torch_allocator"}) == 1


def test_without_snapshot(registry: CollectorRegistry) -> None:
    cuda = FakeCuda()
    TorchAllocatorCollector(SimpleNamespace(cuda=cuda), snapshot=False, registry=registry)
    got = Scraped(registry)
    assert cuda.snapshot_calls == 0
    assert got.get("loadlens_gpu_allocator_reserved_bytes", labels(0)) == 22 * MIB
    assert got.series("loadlens_gpu_allocator_fragmentation_ratio") == {}


@pytest.mark.parametrize(
    "torch",
    [
        SimpleNamespace(cuda=FakeCuda(available=False)),
        SimpleNamespace(cuda=FakeCuda(initialized=False)),  # reading would create a CUDA context
        SimpleNamespace(),
    ],
    ids=["no-cuda", "cuda-not-initialised", "no-cuda-module"],
)
def test_yields_nothing_without_cuda(torch: Any, registry: CollectorRegistry) -> None:
    TorchAllocatorCollector(torch, registry=registry)
    assert list(registry.collect()) == []


def test_torch_absent_yields_nothing(registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    TorchAllocatorCollector(registry=registry)
    assert list(registry.collect()) == []
    assert list(registry.collect()) == []  # and keeps answering


def test_a_cuda_error_reports_failure_and_never_raises(registry: CollectorRegistry) -> None:
    TorchAllocatorCollector(SimpleNamespace(cuda=FakeCuda(fail=True)), registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_collector_success", {"collector": "torch_allocator"}) == 0
    assert got.series("loadlens_gpu_allocator_reserved_bytes") == {}


def test_registers_on_default_registry_only_when_asked() -> None:
    c = TorchAllocatorCollector(SimpleNamespace(cuda=FakeCuda()), registry=None)
    assert c.describe() == []


def test_snapshot_without_segments_for_device() -> None:
    r = reading_from_torch({"reserved_bytes.all.current": 0}, [], device=3)
    assert (r.largest_free_block_bytes, r.total_free_bytes, r.fragmentation_ratio) == (0, 0, 0.0)
