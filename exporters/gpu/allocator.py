"""The caching-allocator reading shared by the torch collector and the sim backend (same series names).

A reading comes from ``torch.cuda.memory_stats()`` + ``torch.cuda.memory_snapshot()`` inside the process
that owns the GPU memory, or from the sim engine's allocator model. Fragmentation follows LLNL Umpire:
``1 - largest_free_block / total_free`` over the free (``inactive``) blocks inside reserved segments; 0 when
nothing is free (nothing to fragment).

>>> r = reading_from_torch({"reserved_bytes.all.current": 100}, [
...     {"device": 0, "blocks": [{"size": 30, "state": "inactive"}, {"size": 10, "state": "inactive"},
...                              {"size": 60, "state": "active_allocated"}]}], device=0)
>>> r.largest_free_block_bytes, r.total_free_bytes, r.fragmentation_ratio
(30, 40, 0.25)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric

from exporters.gpu.collector import counter, gauge


@dataclass(frozen=True, slots=True)
class AllocatorReading:
    """Current allocator state for one device; ``None`` where the source does not provide a field."""

    reserved_bytes: int
    allocated_bytes: int
    active_bytes: int
    inactive_split_bytes: int
    requested_bytes: int
    segments: int
    alloc_retries: int
    ooms: int
    largest_free_block_bytes: int | None
    total_free_bytes: int | None

    @property
    def fragmentation_ratio(self) -> float | None:
        if self.largest_free_block_bytes is None or self.total_free_bytes is None:
            return None
        if self.total_free_bytes <= 0:
            return 0.0
        return 1.0 - self.largest_free_block_bytes / self.total_free_bytes

    @property
    def rounding_overhead_bytes(self) -> int:
        """What block rounding adds on top of what callers asked for (guide 2.2: ~1.2 MB asks, 2 MB blocks)."""
        return max(0, self.allocated_bytes - self.requested_bytes)


def reading_from_state(state: Any) -> AllocatorReading:
    """From the sim's :class:`loadlens.contracts.device_state.AllocatorState`."""
    return AllocatorReading(
        reserved_bytes=state.reserved_bytes,
        allocated_bytes=state.allocated_bytes,
        active_bytes=state.active_bytes,
        inactive_split_bytes=state.inactive_split_bytes,
        requested_bytes=state.requested_bytes,
        segments=state.segments,
        alloc_retries=state.alloc_retries,
        ooms=state.ooms,
        largest_free_block_bytes=state.largest_free_block_bytes,
        total_free_bytes=state.total_free_bytes,
    )


def free_blocks(segments: Iterable[Mapping[str, Any]], device: int) -> tuple[int, int] | None:
    """(largest, total) inactive-block bytes of ``device`` in a memory_snapshot(); None for no segments."""
    largest = total = 0
    seen = False
    for seg in segments:
        if int(seg.get("device", device)) != device:
            continue
        seen = True
        for block in seg.get("blocks", ()):
            if block.get("state") == "inactive":
                size = int(block.get("size", 0))
                total += size
                largest = max(largest, size)
    return (largest, total) if seen else None


def reading_from_torch(
    stats: Mapping[str, Any], snapshot: Sequence[Mapping[str, Any]] | None, *, device: int
) -> AllocatorReading:
    """From ``torch.cuda.memory_stats(device)`` and (optionally) ``torch.cuda.memory_snapshot()``."""

    def stat(key: str) -> int:
        return int(stats.get(key, 0))

    blocks = free_blocks(snapshot, device) if snapshot is not None else None
    if snapshot is not None and blocks is None:
        blocks = (0, 0)  # a snapshot without segments: nothing reserved, nothing free
    return AllocatorReading(
        reserved_bytes=stat("reserved_bytes.all.current"),
        allocated_bytes=stat("allocated_bytes.all.current"),
        active_bytes=stat("active_bytes.all.current"),
        inactive_split_bytes=stat("inactive_split_bytes.all.current"),
        requested_bytes=stat("requested_bytes.all.current"),
        segments=stat("segment.all.current"),
        alloc_retries=stat("num_alloc_retries"),
        ooms=stat("num_ooms"),
        largest_free_block_bytes=None if blocks is None else blocks[0],
        total_free_bytes=None if blocks is None else blocks[1],
    )


def allocator_families(readings: Iterable[tuple[Sequence[str], AllocatorReading]]) -> Iterator[Metric]:
    """The ``loadlens_gpu_allocator_*`` families for (device labels, reading) pairs."""
    reserved = gauge("allocator_reserved_bytes", "Bytes held in allocator segments (cudaMalloc'd).")
    allocated = gauge("allocator_allocated_bytes", "Bytes in blocks handed to callers (after rounding).")
    active = gauge("allocator_active_bytes", "Bytes in active blocks (allocated or awaiting stream free).")
    inactive_split = gauge(
        "allocator_inactive_split_bytes", "Free bytes in split blocks: the allocator's own fragmentation."
    )
    requested = gauge("allocator_requested_bytes", "Bytes callers asked for, before rounding to blocks.")
    overhead = gauge("allocator_rounding_overhead_bytes", "allocated - requested: bytes lost to block rounding.")
    segments = gauge("allocator_segments", "Allocator segments (each one cudaMalloc).")
    retries = counter("allocator_alloc_retries", "cudaMalloc retries after freeing cached blocks.")
    ooms = counter("allocator_ooms", "Out-of-memory errors raised by the allocator.")
    free = gauge("allocator_free_bytes", "Free bytes inside reserved segments (inactive blocks).")
    largest = gauge("allocator_largest_free_block_bytes", "Largest free block inside reserved segments.")
    frag = gauge("allocator_fragmentation_ratio", "1 - largest free block / total free bytes (0 when nothing is free).")
    for labels, r in readings:
        lv = list(labels)
        reserved.add_metric(lv, float(r.reserved_bytes))
        allocated.add_metric(lv, float(r.allocated_bytes))
        active.add_metric(lv, float(r.active_bytes))
        inactive_split.add_metric(lv, float(r.inactive_split_bytes))
        requested.add_metric(lv, float(r.requested_bytes))
        overhead.add_metric(lv, float(r.rounding_overhead_bytes))
        segments.add_metric(lv, float(r.segments))
        retries.add_metric(lv, float(r.alloc_retries))
        ooms.add_metric(lv, float(r.ooms))
        if r.total_free_bytes is not None:
            free.add_metric(lv, float(r.total_free_bytes))
        if r.largest_free_block_bytes is not None:
            largest.add_metric(lv, float(r.largest_free_block_bytes))
        ratio = r.fragmentation_ratio
        if ratio is not None:
            frag.add_metric(lv, ratio)
    yield from (reserved, allocated, active, inactive_split, requested, overhead, segments, retries, ooms)
    yield from (free, largest, frag)
