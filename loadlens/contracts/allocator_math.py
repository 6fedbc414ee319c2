"""Caching-allocator maths over ``torch.cuda.memory_stats()`` and ``torch.cuda.memory_snapshot()`` data.

Pure functions over plain dicts and lists, so the GPU exporter (sim and torch collectors) and the
in-process probe (``exporters.probe``) share one definition without importing each other. Fragmentation
follows LLNL Umpire: ``1 - largest_free_block / total_free`` over the free (``inactive``) blocks inside
reserved segments; 0 when nothing is free (nothing to fragment).

>>> r = reading_from_torch({"reserved_bytes.all.current": 100}, [
...     {"device": 0, "blocks": [{"size": 30, "state": "inactive"}, {"size": 10, "state": "inactive"},
...                              {"size": 60, "state": "active_allocated"}]}], device=0)
>>> r.largest_free_block_bytes, r.total_free_bytes, r.fragmentation_ratio
(30, 40, 0.25)
>>> size_class(2 * 2**20), size_class(20 * 2**20 + 1), size_class(2**31)
('le_2mib', 'le_128mib', 'gt_1gib')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIB = 2**20
# Segment size classes: small-pool segments are 2 MiB; large ones start at 20 MiB (the allocator's
# kLargeBuffer) unless the request itself is larger. Upper bounds in bytes, then the open-ended class.
SIZE_CLASSES: tuple[tuple[str, int], ...] = (
    ("le_2mib", 2 * MIB),
    ("le_20mib", 20 * MIB),
    ("le_128mib", 128 * MIB),
    ("le_1gib", 1024 * MIB),
)
OPEN_SIZE_CLASS = "gt_1gib"
POOLS = ("small", "large")
# Block states of memory_snapshot(); only "inactive" is free.
FREE_STATE = "inactive"


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
        return fragmentation(self.largest_free_block_bytes, self.total_free_bytes)

    @property
    def rounding_overhead_bytes(self) -> int:
        """What block rounding adds on top of what callers asked for (guide 2.2: ~1.2 MB asks, 2 MB blocks)."""
        return max(0, self.allocated_bytes - self.requested_bytes)


def fragmentation(largest_free: int | None, total_free: int | None) -> float | None:
    if largest_free is None or total_free is None:
        return None
    if total_free <= 0:
        return 0.0
    return 1.0 - largest_free / total_free


def free_blocks(segments: Iterable[Mapping[str, Any]], device: int) -> tuple[int, int] | None:
    """(largest, total) inactive-block bytes of ``device`` in a memory_snapshot(); None for no segments."""
    largest = total = 0
    seen = False
    for seg in segments:
        if int(seg.get("device", device)) != device:
            continue
        seen = True
        for block in seg.get("blocks", ()):
            if block.get("state") == FREE_STATE:
                size = int(block.get("size", 0))
                total += size
                largest = max(largest, size)
    return (largest, total) if seen else None


def size_class(total_size: int) -> str:
    for name, bound in SIZE_CLASSES:
        if total_size <= bound:
            return name
    return OPEN_SIZE_CLASS


@dataclass(frozen=True, slots=True)
class PoolClass:
    """Segments of one pool and size class: how many, and the bytes they reserve."""

    pool: str
    size_class: str
    segments: int
    reserved_bytes: int


def segments_by_pool(segments: Iterable[Mapping[str, Any]], device: int) -> list[PoolClass]:
    """Segments of ``device`` grouped by pool (``segment_type``) and size class, in a fixed order."""
    counts: dict[tuple[str, str], list[int]] = {}
    for seg in segments:
        if int(seg.get("device", device)) != device:
            continue
        pool = seg.get("segment_type")
        pool = pool if pool in POOLS else "large"  # older snapshots lack it; only large segments exceed 1 MiB
        size = int(seg.get("total_size", 0))
        entry = counts.setdefault((pool, size_class(size)), [0, 0])
        entry[0] += 1
        entry[1] += size
    order = [name for name, _ in SIZE_CLASSES] + [OPEN_SIZE_CLASS]
    keys = sorted(counts, key=lambda k: (POOLS.index(k[0]), order.index(k[1])))
    return [PoolClass(pool, cls, counts[pool, cls][0], counts[pool, cls][1]) for pool, cls in keys]


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


def parse_alloc_conf(text: str) -> dict[str, str]:
    """``PYTORCH_ALLOC_CONF``-style ``key:value,key:value`` as a dict (keys lower-cased, blanks skipped).

    >>> parse_alloc_conf("expandable_segments:True, max_split_size_mb:512,,garbage")
    {'expandable_segments': 'True', 'max_split_size_mb': '512', 'garbage': ''}
    >>> parse_alloc_conf("roundup_power2_divisions:[256:1,512:2],backend:native")
    {'roundup_power2_divisions': '[256:1,512:2]', 'backend': 'native'}
    """
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:  # commas inside [...] belong to the value (roundup_power2_divisions)
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth <= 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    out: dict[str, str] = {}
    for item in items:
        key, _, value = item.partition(":")
        key = key.strip().lower()
        if key:
            out[key] = value.strip()
    return out
