"""A fake ``torch`` for the probe, and ``memory_snapshot()`` documents shaped exactly like real ones.

The shape follows torch/cuda/memory.py's ``_snapshot`` docstring (torch 2.13): a segment has ``device``,
``address``, ``total_size``, ``allocated_size``, ``active_size``, ``requested_size``, ``stream``,
``segment_type`` (small/large), ``segment_pool_id``, ``is_expandable`` and ``blocks``; a block has
``address``, ``size``, ``requested_size``, ``state`` (active_allocated / active_awaiting_free / inactive)
and ``frames``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

MIB = 2**20
BASE_ADDRESS = 0x7F0000000000


def segment(
    device: int,
    blocks: Sequence[tuple[int, int, str]],
    *,
    address: int = BASE_ADDRESS,
    segment_type: str | None = None,
    stream: int = 0,
) -> dict[str, Any]:
    """A segment of (size, requested_size, state) blocks laid out back to back from ``address``."""
    out_blocks = []
    at = address
    for size, requested, state in blocks:
        out_blocks.append({"address": at, "size": size, "requested_size": requested, "state": state, "frames": []})
        at += size
    total = sum(b[0] for b in blocks)
    return {
        "device": device,
        "address": address,
        "total_size": total,
        "stream": stream,
        "segment_type": segment_type or ("small" if total <= 2 * MIB else "large"),
        "segment_pool_id": (0, 0),
        "allocated_size": sum(b[0] for b in blocks if b[2] == "active_allocated"),
        "active_size": sum(b[0] for b in blocks if b[2] != "inactive"),
        "requested_size": sum(b[1] for b in blocks if b[2] != "inactive"),
        "is_expandable": False,
        "blocks": out_blocks,
    }


def synthetic_snapshot(segments: int, blocks_per_segment: int = 8, device: int = 0) -> list[dict[str, Any]]:
    """``segments`` large segments of 2 MiB blocks, every fourth block free: for the cost benchmark."""
    out = []
    for s in range(segments):
        blocks = [
            (2 * MIB, 0, "inactive") if b % 4 == 3 else (2 * MIB, 1_258_291, "active_allocated")
            for b in range(blocks_per_segment)
        ]
        out.append(segment(device, blocks, address=BASE_ADDRESS + s * blocks_per_segment * 2 * MIB))
    return out


def stats(reserved: int, allocated: int, requested: int, **extra: int) -> dict[str, int]:
    """The memory_stats() keys the probe reads, with the ``.all.peak`` one that marks a device as used."""
    base = {
        "reserved_bytes.all.current": reserved,
        "reserved_bytes.all.peak": reserved,
        "allocated_bytes.all.current": allocated,
        "active_bytes.all.current": allocated,
        "inactive_split_bytes.all.current": 0,
        "requested_bytes.all.current": requested,
        "segment.all.current": 0,
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }
    base.update(extra)
    return base


class FakeStream:
    """A fake GPU's one stream, for ``torch.cuda.Event``: the test sets the device time (ms since the start) and
    how much of the recorded work has run (``auto_complete``: everything, as soon as it is recorded)."""

    def __init__(self, auto_complete: bool = True) -> None:
        self.now_ms = 0.0
        self.done_up_to = 0  # events recorded before this sequence number have run
        self.sequence = 0
        self.auto_complete = auto_complete
        self.waits = 0  # Event.synchronize() calls


class FakeEvent:
    """Shaped like ``torch.cuda.Event``: record, query, elapsed_time, synchronize."""

    stream: FakeStream

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.seq = -1
        self.at_ms = 0.0

    def record(self, stream: Any = None) -> None:
        self.seq = self.stream.sequence
        self.at_ms = self.stream.now_ms
        self.stream.sequence += 1

    def query(self) -> bool:
        return self.stream.auto_complete or self.seq < self.stream.done_up_to

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self.query() and other.query(), "elapsed_time on an event still running would wait"
        return other.at_ms - self.at_ms

    def synchronize(self) -> None:
        self.stream.waits += 1
        self.stream.done_up_to = max(self.stream.done_up_to, self.seq + 1)


class FakeCuda:
    """torch.cuda's surface the probe uses. ``calls`` records every call (none may synchronise)."""

    def __init__(
        self,
        device_stats: dict[int, dict[str, int]],
        snapshot: list[dict[str, Any]],
        *,
        available: bool = True,
        initialized: bool = True,
        traces_kwarg: bool = True,
    ) -> None:
        self.device_stats = device_stats
        self.snapshot = snapshot
        self.available = available
        self.initialized = initialized
        self.traces_kwarg = traces_kwarg
        self.calls: list[str] = []
        self.fail_stats = False
        self.stream = FakeStream()
        self.Event = type("Event", (FakeEvent,), {"stream": self.stream})

    def current_device(self) -> int:
        return 0

    def current_stream(self) -> FakeStream:
        return self.stream

    def is_available(self) -> bool:
        return self.available

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return len(self.device_stats)

    def get_device_name(self, i: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def get_device_properties(self, i: int) -> Any:
        return SimpleNamespace(uuid=f"5e1f0000-0000-4000-8000-{i:012x}")

    def get_allocator_backend(self) -> str:
        return "native"

    def memory_stats(self, device: int) -> dict[str, int]:
        self.calls.append("memory_stats")
        if self.fail_stats:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return dict(self.device_stats[device])

    def memory_snapshot(self, **kwargs: Any) -> list[dict[str, Any]]:
        if kwargs and not self.traces_kwarg:
            raise TypeError("memory_snapshot() got an unexpected keyword argument 'include_traces'")
        self.calls.append(f"memory_snapshot{kwargs}")
        return list(self.snapshot)

    def synchronize(self, device: Any = None) -> None:  # pragma: no cover - the probe must never call it
        raise AssertionError("the probe called torch.cuda.synchronize")


def fake_torch(cuda: FakeCuda) -> Any:
    return SimpleNamespace(cuda=cuda, __version__="2.13.0+fake")


def uuid(i: int) -> str:
    return f"GPU-5e1f0000-0000-4000-8000-{i:012x}"
