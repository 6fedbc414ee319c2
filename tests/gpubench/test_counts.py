"""FLOP and byte counts per shape, shares of peak and the roofline, with the H200 figures of issue 24."""

from __future__ import annotations

import pytest

from loadlens.gpubench import counts
from tests.gpubench.h200_figures import HBM, PEAK, h200_result


def test_attention_flops_of_the_guides_shapes() -> None:
    # 4·b·h·s²·d at heads 32, head dim 128: every factor a power of two.
    assert counts.attention_flops(64, 32, 512, 128, causal=False) == 2.0**38
    assert counts.attention_flops(16, 32, 2048, 128, causal=False) == 2.0**40
    assert counts.attention_flops(4, 32, 8192, 128, causal=False) == 2.0**42
    # Causal: half (FlashAttention's benchmark convention), not s(s+1)/2 pairs.
    assert counts.attention_flops(4, 32, 8192, 128, causal=True) == 2.0**41


def test_kv_read_bytes() -> None:
    # 2 (K and V) · batch 8 · heads 32 · context · head dim 128 · 2 bytes
    assert counts.kv_read_bytes(8, 32, 2048, 128, "bf16") == 2**28
    assert counts.kv_read_bytes(8, 32, 8192, 128, "fp16") == 2**30
    assert counts.kv_read_bytes(1, 1, 1, 1, "fp32") == 8


def test_gemm_and_copy_counts() -> None:
    assert counts.gemm_flops(4096, 14336, 4096) == 2 * 4096 * 14336 * 4096
    assert counts.gemm_bytes(8, 14336, 4096, "bf16") == (8 * 4096 + 4096 * 14336 + 8 * 14336) * 2
    assert counts.copy_bytes(1000, "bf16") == 4000


def test_share_and_roof() -> None:
    assert counts.share(569e12, PEAK) == 569 / 989.5
    assert counts.share(569e12, None) is None
    assert counts.share(None, PEAK) is None
    ridge = PEAK / HBM  # 206.1 FLOP/B
    assert counts.roof(ridge * 2, PEAK, HBM) == ("compute", PEAK)
    assert counts.roof(8.0, PEAK, HBM) == ("memory", 8.0 * HBM)
    assert counts.roof(8.0, None, HBM) == (None, None)


def test_rows_turn_the_issues_times_back_into_its_rates() -> None:
    result = h200_result()
    cudnn = [r for r in result.attention if r.backend == "cudnn" and r.dtype == "bf16"]
    assert [round(r.tflops, 6) for r in cudnn] == [569, 667, 625]  # type: ignore[arg-type]
    # "58-67 % of the 989 dense peak" (issue 24): 569 / 989.5 and 667 / 989.5
    assert [round(100 * r.share_of_peak, 1) for r in cudnn] == [57.5, 67.4, 63.2]  # type: ignore[operator]
    decode = [r for r in result.decode if r.backend == "cudnn"]
    assert [round(r.gb_per_s, 6) for r in decode] == [4074, 4294, 4435]  # type: ignore[arg-type]
    # "~92 % of HBM" at 8,192
    assert round(100 * decode[-1].share_of_hbm, 1) == 92.4  # type: ignore[operator]
    skipped = next(r for r in result.attention if r.backend == "math" and r.seq_len == 8192)
    assert (skipped.status, skipped.tflops, skipped.share_of_peak, skipped.median_seconds) == (
        "unavailable", None, None, None)  # fmt: skip


def test_row_without_a_peak_has_figures_but_no_share() -> None:
    row = counts.attention_row("flash", "bf16", 512, 64, 32, 128, causal=False, seconds=[2e-3, 1e-3, 3e-3],
                               peak_flops=None)  # fmt: skip
    assert row.median_seconds == 2e-3
    assert row.tflops == 2.0**38 / 2e-3 / 1e12
    assert row.share_of_peak is None


def test_gemm_row_bound_and_share_of_roof() -> None:
    # decode-like: intensity ~8 FLOP/B, memory-bound; at 3.6 TB/s it reaches 75 % of the 4.8 TB/s roof.
    moved = counts.gemm_bytes(8, 14336, 4096, "bf16")
    row = counts.gemm_row("decode", "gate_proj", 8, 14336, 4096, "bf16", seconds=[moved / 3.6e12], peak_flops=PEAK,
                          hbm=HBM)  # fmt: skip
    assert row.bound == "memory"
    assert row.intensity == counts.gemm_flops(8, 14336, 4096) / moved
    assert row.share_of_roof == pytest.approx(0.75, rel=1e-12)
    assert row.gb_per_s == pytest.approx(3600.0, rel=1e-12)
    copy = counts.copy_row("decode", "w", 1000, "bf16", seconds=[4000 / 2.4e12], hbm=HBM)
    assert (copy.bound, copy.flops, copy.intensity) == ("memory", 0.0, 0.0)
    assert copy.share_of_roof == pytest.approx(0.5, rel=1e-12)
