"""FLOP and byte counts per shape, shares of peak, and the result rows built from measured times. Pure: the
measurement hands in seconds, so this is tested with recorded figures (the H200 numbers of issue 24).

Conventions (docs/gpu-bench.md):

- Attention FLOPs, non-causal: 4·b·h·s²·d (Q·Kᵀ and P·V, each 2·b·h·s²·d multiply-adds counted as 2 FLOPs).
  Causal: half of that, 4·b·h·s²·d / 2, the convention of FlashAttention's own benchmark, so causal TFLOP/s
  compare with published FlashAttention figures. The exact count of unmasked (query, key) pairs, s(s+1)/2,
  which the sim's roofline uses, is larger by a factor (s+1)/s: 0.2 % at s = 512, 0.01 % at 8,192.
- Decode KV read: one query token per sequence reads all of K and V: 2 · b · h · context · d · element bytes.
  Bandwidth is in GB/s = 10^9 B/s, HBM datasheet units.
- GEMM (m×k)·(k×n): 2·m·n·k FLOPs; bytes = (m·k + k·n + m·n) · element bytes, each operand read once and the
  output written once (what a perfect kernel moves). Copy of a tensor of N bytes: 2·N bytes (read + write).
- Roof: min(peak FLOP/s, intensity · HBM B/s); a shape is compute-bound when its intensity exceeds
  peak / HBM (the ridge point).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from loadlens.contracts.gpu_bench_result import AttentionRow, DecodeRow, RooflineRow

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, *, causal: bool) -> float:
    full = 4.0 * batch * heads * seq_len * seq_len * head_dim
    return full / 2 if causal else full


def kv_read_bytes(batch: int, heads: int, context: int, head_dim: int, dtype: str) -> int:
    return 2 * batch * heads * context * head_dim * ELEMENT_BYTES[dtype]


def score_matrix_bytes(batch: int, heads: int, seq_len: int, dtype: str) -> int:
    """What the math backend materialises: the b·h·s² attention scores."""
    return batch * heads * seq_len * seq_len * ELEMENT_BYTES[dtype]


def gemm_flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def gemm_bytes(m: int, n: int, k: int, dtype: str) -> float:
    return float((m * k + k * n + m * n) * ELEMENT_BYTES[dtype])


def copy_bytes(numel: int, dtype: str) -> float:
    return float(2 * numel * ELEMENT_BYTES[dtype])


def share(value: float | None, peak: float | None) -> float | None:
    """``value / peak``; None when either is unknown."""
    if value is None or peak is None or peak <= 0:
        return None
    return value / peak


def median(seconds: Sequence[float]) -> float:
    if not seconds:
        raise ValueError("no timings")
    return float(statistics.median(seconds))


def roof(intensity: float, peak_flops: float | None, hbm: float | None) -> tuple[str | None, float | None]:
    """(bound, attainable FLOP/s) at ``intensity`` FLOP/B; (None, None) with an unknown peak."""
    if peak_flops is None or hbm is None:
        return None, None
    memory_roof = intensity * hbm
    return ("compute", peak_flops) if memory_roof >= peak_flops else ("memory", memory_roof)


def attention_row(
    backend: str,
    dtype: str,
    seq_len: int,
    batch: int,
    heads: int,
    head_dim: int,
    *,
    causal: bool,
    seconds: Sequence[float] | None,
    peak_flops: float | None,
    reason: str | None = None,
    status: str = "unavailable",
) -> AttentionRow:
    """The row of one (backend, dtype, shape): figures from ``seconds``, or ``status`` and ``reason`` without."""
    flops = attention_flops(batch, heads, seq_len, head_dim, causal=causal)
    base = {"backend": backend, "dtype": dtype, "seq_len": seq_len, "batch": batch, "heads": heads,
            "head_dim": head_dim, "causal": causal, "flops": flops}  # fmt: skip
    if seconds is None:
        return AttentionRow(**base, status=status, reason=reason)  # type: ignore[arg-type]
    t = median(seconds)
    rate = flops / t
    return AttentionRow(**base, status="ok", median_seconds=t, tflops=rate / 1e12,  # type: ignore[arg-type]
                        share_of_peak=share(rate, peak_flops))  # fmt: skip


def decode_row(
    backend: str,
    dtype: str,
    context: int,
    batch: int,
    heads: int,
    head_dim: int,
    *,
    seconds: Sequence[float] | None,
    hbm: float | None,
    reason: str | None = None,
    status: str = "unavailable",
) -> DecodeRow:
    kv = kv_read_bytes(batch, heads, context, head_dim, dtype)
    base = {"backend": backend, "dtype": dtype, "context": context, "batch": batch, "heads": heads,
            "head_dim": head_dim, "kv_bytes": kv}  # fmt: skip
    if seconds is None:
        return DecodeRow(**base, status=status, reason=reason)  # type: ignore[arg-type]
    t = median(seconds)
    rate = kv / t
    return DecodeRow(**base, status="ok", median_seconds=t, gb_per_s=rate / 1e9,  # type: ignore[arg-type]
                     share_of_hbm=share(rate, hbm))  # fmt: skip


def gemm_row(
    phase: str,
    label: str,
    m: int,
    n: int,
    k: int,
    dtype: str,
    *,
    seconds: Sequence[float] | None,
    peak_flops: float | None,
    hbm: float | None,
    reason: str | None = None,
    status: str = "unavailable",
) -> RooflineRow:
    flops, moved = gemm_flops(m, n, k), gemm_bytes(m, n, k, dtype)
    intensity = flops / moved
    bound, attainable = roof(intensity, peak_flops, hbm)
    base = {"op": "gemm", "phase": phase, "label": label, "dtype": dtype, "m": m, "n": n, "k": k, "flops": flops,
            "bytes": moved, "intensity": intensity, "bound": bound}  # fmt: skip
    if seconds is None:
        return RooflineRow(**base, status=status, reason=reason)  # type: ignore[arg-type]
    t = median(seconds)
    return RooflineRow(**base, status="ok", median_seconds=t, tflops=flops / t / 1e12,  # type: ignore[arg-type]
                       gb_per_s=moved / t / 1e9, share_of_roof=share(flops / t, attainable))  # fmt: skip


def copy_row(
    phase: str,
    label: str,
    numel: int,
    dtype: str,
    *,
    seconds: Sequence[float] | None,
    hbm: float | None,
    reason: str | None = None,
    status: str = "unavailable",
) -> RooflineRow:
    moved = copy_bytes(numel, dtype)
    base = {"op": "copy", "phase": phase, "label": label, "dtype": dtype, "m": None, "n": None, "k": None,
            "flops": 0.0, "bytes": moved, "intensity": 0.0, "bound": None if hbm is None else "memory"}  # fmt: skip
    if seconds is None:
        return RooflineRow(**base, status=status, reason=reason)  # type: ignore[arg-type]
    t = median(seconds)
    return RooflineRow(**base, status="ok", median_seconds=t, tflops=0.0, gb_per_s=moved / t / 1e9,  # type: ignore[arg-type]
                       share_of_roof=share(moved / t, hbm))  # fmt: skip
