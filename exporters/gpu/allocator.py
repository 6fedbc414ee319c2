"""Allocator readings as ``loadlens_gpu_allocator_*`` families, shared by the sim, torch and probe collectors.

The maths (:class:`AllocatorReading`, ``reading_from_torch``, fragmentation) lives in
:mod:`loadlens.contracts.allocator_math`, which the in-process probe uses too. The family builders take
the label names, so the probe collector adds ``pid`` and ``role`` to the device labels.

>>> from loadlens.contracts.allocator_math import reading_from_torch
>>> fams = list(allocator_families([(["0", "GPU-x", "H100"], reading_from_torch({"num_ooms": 2}, None, device=0))]))
>>> [(f.name, f.rows) for f in fams if f.name.endswith("ooms")]
[('loadlens_gpu_allocator_ooms', [(['0', 'GPU-x', 'H100'], 2.0)])]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client.core import Metric

from exporters.gpu.collector import DEVICE_LABELS, counter, gauge
from loadlens.contracts.allocator_math import AllocatorReading


def reading_from_state(state: Any) -> AllocatorReading:
    """From any object with the allocator fields: the sim's
    :class:`loadlens.contracts.device_state.AllocatorState` or a probe document's device entry."""
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


def allocator_families(
    readings: Iterable[tuple[Sequence[str], AllocatorReading]], labels: Sequence[str] = DEVICE_LABELS
) -> Iterator[Metric]:
    """The ``loadlens_gpu_allocator_*`` families for (label values, reading) pairs."""
    names = labels
    reserved = gauge("allocator_reserved_bytes", "Bytes held in allocator segments (cudaMalloc'd).", names)
    allocated = gauge("allocator_allocated_bytes", "Bytes in blocks handed to callers (after rounding).", names)
    active = gauge("allocator_active_bytes", "Bytes in active blocks (allocated or awaiting stream free).", names)
    inactive_split = gauge(
        "allocator_inactive_split_bytes", "Free bytes in split blocks: the allocator's own fragmentation.", names
    )
    requested = gauge("allocator_requested_bytes", "Bytes callers asked for, before rounding to blocks.", names)
    overhead = gauge("allocator_rounding_overhead_bytes", "allocated - requested: bytes lost to block rounding.", names)
    segments = gauge("allocator_segments", "Allocator segments (each one cudaMalloc).", names)
    retries = counter("allocator_alloc_retries", "cudaMalloc retries after freeing cached blocks.", names)
    ooms = counter("allocator_ooms", "Out-of-memory errors raised by the allocator.", names)
    free = gauge("allocator_free_bytes", "Free bytes inside reserved segments (inactive blocks).", names)
    largest = gauge("allocator_largest_free_block_bytes", "Largest free block inside reserved segments.", names)
    frag = gauge(
        "allocator_fragmentation_ratio", "1 - largest free block / total free bytes (0 when nothing is free).", names
    )
    for values, r in readings:
        lv = list(values)
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
