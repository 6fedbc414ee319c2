"""From ``torch.cuda`` readings to the document's per-device entries (pure; no torch import).

The snapshot is reduced to what the document carries (free blocks and pools per device) as soon as it is
taken, so the probe never keeps a large ``memory_snapshot()`` list alive between snapshots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadlens.contracts.allocator_math import fragmentation, free_blocks, reading_from_torch, segments_by_pool
from loadlens.contracts.probe_document import PoolSegments, ProbeDevice


@dataclass(frozen=True, slots=True)
class SnapshotSummary:
    """What one device's part of a snapshot contributes to the document."""

    largest_free_block_bytes: int
    total_free_bytes: int
    pools: tuple[PoolSegments, ...]
    taken_at: float


def summarise_snapshot(
    snapshot: Sequence[Mapping[str, Any]], devices: Sequence[int], taken_at: float
) -> dict[int, SnapshotSummary]:
    by_device: dict[int, list[Mapping[str, Any]]] = {i: [] for i in devices}
    for seg in snapshot:
        dev = int(seg.get("device", 0))
        if dev in by_device:
            by_device[dev].append(seg)
    out: dict[int, SnapshotSummary] = {}
    for dev, segs in by_device.items():
        largest, total = free_blocks(segs, dev) or (0, 0)
        pools = tuple(
            PoolSegments(pool=p.pool, size_class=p.size_class, segments=p.segments, reserved_bytes=p.reserved_bytes)
            for p in segments_by_pool(segs, dev)
        )
        out[dev] = SnapshotSummary(largest, total, pools, taken_at)
    return out


def device_entry(
    index: int,
    uuid: str,
    name: str,
    stats: Mapping[str, Any],
    summary: SnapshotSummary | None,
    stats_at: float,
) -> ProbeDevice:
    r = reading_from_torch(stats, None, device=index)
    largest = summary.largest_free_block_bytes if summary else None
    total = summary.total_free_bytes if summary else None
    return ProbeDevice(
        cuda_index=index,
        uuid=uuid,
        name=name,
        reserved_bytes=r.reserved_bytes,
        allocated_bytes=r.allocated_bytes,
        active_bytes=r.active_bytes,
        inactive_split_bytes=r.inactive_split_bytes,
        requested_bytes=r.requested_bytes,
        rounding_overhead_bytes=r.rounding_overhead_bytes,
        segments=r.segments,
        alloc_retries=r.alloc_retries,
        ooms=r.ooms,
        largest_free_block_bytes=largest,
        total_free_bytes=total,
        fragmentation_ratio=fragmentation(largest, total),
        pools=list(summary.pools) if summary else [],
        stats_at=stats_at,
        snapshot_at=summary.taken_at if summary else None,
    )


def used(stats: Mapping[str, Any]) -> bool:
    """Whether this process ever reserved memory on the device (others would only add zero series)."""
    return bool(stats) and (
        int(stats.get("reserved_bytes.all.peak", 0)) > 0 or int(stats.get("reserved_bytes.all.current", 0)) > 0
    )
