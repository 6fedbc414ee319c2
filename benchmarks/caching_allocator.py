"""PyTorch's native caching allocator, as pure functions: how a request is rounded, which pool serves it,
what segment a miss reserves, a replay of allocations (``simulate``), and what one LoRA adapter of a given
model shape asks of it. The expectations ``benchmarks/gpu_probe_check.py`` holds the exporter's figures to
(docs/probe-documents.md, "GPU check"); tested on CPU in tests/benchmarks/test_gpu_probe_check.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

MIB = 2**20
# PyTorch's native caching allocator (c10 CachingAllocator constants, unchanged from 1.x to 2.x; checked
# against CUDACachingAllocator.cpp / c10/core/AllocatorConfig.h and the "Memory management" notes):
MIN_BLOCK = 512  # every request is rounded up to a multiple of 512 B
SMALL_SIZE = 1 * MIB  # requests <= 1 MiB are served from the small pool
SMALL_BUFFER = 2 * MIB  # ... whose segments are 2 MiB each
LARGE_BUFFER = 20 * MIB  # requests in (1 MiB, 10 MiB) get a 20 MiB large-pool segment
MIN_LARGE_ALLOC = 10 * MIB  # from 10 MiB on, the segment is the request rounded up to ...
ROUND_LARGE = 2 * MIB  # ... 2 MiB
# A found block is split when the rest is >= 512 B (small pool) or > 1 MiB (large pool); otherwise the
# caller gets the whole block and allocated_bytes counts all of it (rounding overhead beyond 512 B).

GUIDE_REQUEST = 1_200_000  # guide 2.2: "each LoRA module asks about 1.2 MB"
GUIDE_ADAPTERS, GUIDE_MODULES = 3, 8  # 3 adapters; q/v in 4 layers


def round_size(size: int) -> int:
    """The block size a request of ``size`` bytes asks the pool for."""
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * math.ceil(size / MIN_BLOCK)


def pool_of(rounded: int) -> str:
    return "small" if rounded <= SMALL_SIZE else "large"


def segment_size(rounded: int) -> int:
    """What cudaMalloc is asked for when no cached block fits."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * math.ceil(rounded / ROUND_LARGE)


@dataclass
class SimState:
    reserved: int = 0
    allocated: int = 0
    requested: int = 0
    segments: dict[str, int] = field(default_factory=lambda: {"small": 0, "large": 0})
    free: dict[str, list[int]] = field(default_factory=lambda: {"small": [], "large": []})

    @property
    def rounding_overhead(self) -> int:
        return self.allocated - self.requested


def simulate(sizes: Sequence[int], state: SimState | None = None) -> SimState:
    """Allocations only (no frees), one stream, default PYTORCH_ALLOC_CONF: best fit, split, new segments."""
    s = state if state is not None else SimState()
    for size in sizes:
        rounded = round_size(size)
        pool = pool_of(rounded)
        fits = [b for b in s.free[pool] if b >= rounded]
        if fits:
            block = min(fits)
            s.free[pool].remove(block)
        else:
            block = segment_size(rounded)
            s.reserved += block
            s.segments[pool] += 1
        rest = block - rounded
        if rest >= MIN_BLOCK if pool == "small" else rest > SMALL_SIZE:
            s.free[pool].append(rest)
            block = rounded
        s.allocated += block
        s.requested += size
    return s


@dataclass(frozen=True)
class ModelShape:
    hidden: int = 1024
    layers: int = 4
    heads: int = 16
    kv_heads: int = 8
    intermediate: int = 2816
    vocab: int = 32000
    rank: int = 8
    dtype_bytes: int = 4  # fp32 base model: PEFT keeps the adapter in the base weight's dtype

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def lora_tensor_bytes(shape: ModelShape) -> list[int]:
    """Bytes of each tensor one rank-r adapter on q_proj and v_proj adds: A is r x in, B is out x r."""
    q_out, v_out = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_layer = []
    for out in (q_out, v_out):
        per_layer += [shape.rank * shape.hidden * shape.dtype_bytes, out * shape.rank * shape.dtype_bytes]
    return per_layer * shape.layers


def lora_module_bytes(shape: ModelShape) -> dict[str, int]:
    """Per module: rank x (in + out) x dtype size."""
    q_out, v_out = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return {
        "q_proj": shape.rank * (shape.hidden + q_out) * shape.dtype_bytes,
        "v_proj": shape.rank * (shape.hidden + v_out) * shape.dtype_bytes,
    }


def expected_adapter(shape: ModelShape) -> dict[str, int]:
    """What one adapter adds to requested and (at least) allocated bytes, and its most extra from unsplit rests."""
    sizes = lora_tensor_bytes(shape)
    rounded = [round_size(s) for s in sizes]
    large = sum(1 for r in rounded if pool_of(r) == "large")
    return {
        "tensors": len(sizes),
        "requested_bytes": sum(sizes),
        "allocated_bytes_min": sum(rounded),
        # Blocks and rests are 512 B multiples, so a small-pool block is split or fits exactly; a large-pool
        # block with a rest <= 1 MiB is handed out whole: up to 1 MiB more per large tensor.
        "allocated_bytes_max": sum(rounded) + large * SMALL_SIZE,
        "rounding_overhead_bytes": sum(rounded) - sum(sizes),
    }
