from __future__ import annotations

from prometheus_client import CollectorRegistry

from exporters.gpu.allocator import reading_from_state
from exporters.gpu.collectors.allocator import AllocatorCollector
from loadlens.contracts.allocator_math import AllocatorReading
from tests.gpu.helpers import MakeRig, Scraped, SimRig

L0 = {"gpu": "0", "uuid": "GPU-5e1f0000-0000-4000-8000-000000000000", "model": "NVIDIA H100 80GB HBM3"}


def test_sim_allocator_series(rig: SimRig, registry: CollectorRegistry) -> None:
    AllocatorCollector(rig.session, registry=registry)
    got = Scraped(registry)
    a = rig.source.state.devices[0].allocator
    assert got.get("loadlens_gpu_allocator_reserved_bytes", L0) == a.reserved_bytes
    assert got.get("loadlens_gpu_allocator_allocated_bytes", L0) == a.allocated_bytes
    assert got.get("loadlens_gpu_allocator_active_bytes", L0) == a.active_bytes
    assert got.get("loadlens_gpu_allocator_inactive_split_bytes", L0) == a.inactive_split_bytes
    assert got.get("loadlens_gpu_allocator_requested_bytes", L0) == a.requested_bytes
    assert got.get("loadlens_gpu_allocator_segments", L0) == 412
    assert got.get("loadlens_gpu_allocator_alloc_retries_total", L0) == 2
    assert got.get("loadlens_gpu_allocator_ooms_total", L0) == 0
    assert got.get("loadlens_gpu_allocator_free_bytes", L0) == 640 * 2**20
    assert got.get("loadlens_gpu_allocator_largest_free_block_bytes", L0) == 160 * 2**20
    assert got.get("loadlens_gpu_allocator_fragmentation_ratio", L0) == 0.75  # 1 - 160 / 640
    # Guide 2.2: 3 adapters x 64 modules, each asks ~1.2 MB (1258291 B) and gets a 2 MiB block.
    assert got.get("loadlens_gpu_allocator_rounding_overhead_bytes", L0) == 3 * 64 * (2 * 2**20 - 1_258_291)


def test_allocator_unsupported_is_absent(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:allocator")
    AllocatorCollector(rig.session, registry=registry)
    got = Scraped(registry)
    allocator_families = [n for n in got.names if n.startswith("loadlens_gpu_allocator")]
    assert allocator_families
    assert all(got.series(n) == {} for n in allocator_families)
    assert got.get("loadlens_gpu_collector_success", {"collector": "allocator"}) == 1


def test_fragmentation_edge_cases() -> None:
    def reading(largest: int | None, total: int | None) -> AllocatorReading:
        return AllocatorReading(10, 8, 8, 0, 6, 1, 0, 0, largest, total)

    assert reading(0, 0).fragmentation_ratio == 0.0  # nothing free: nothing fragmented
    assert reading(5, 5).fragmentation_ratio == 0.0  # one free block
    assert reading(1, 4).fragmentation_ratio == 0.75
    assert reading(None, None).fragmentation_ratio is None
    assert reading(0, 0).rounding_overhead_bytes == 2
    assert AllocatorReading(10, 4, 4, 0, 6, 1, 0, 0, None, None).rounding_overhead_bytes == 0


def test_reading_from_state_copies_every_field(rig: SimRig) -> None:
    a = rig.source.state.devices[0].allocator
    r = reading_from_state(a)
    assert r.total_free_bytes == a.total_free_bytes
    assert r.largest_free_block_bytes == a.largest_free_block_bytes
    assert r.alloc_retries == a.alloc_retries
