"""The measurement code with the timer injected: rows from recorded times on the CPU's kernels, and how a
declined backend, a failing kernel and running out of memory are reported."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from loadlens.gpubench import counts, measure
from loadlens.gpubench.plan import build_plan
from tests.gpubench.h200_figures import LLAMA_8B


def fixed_timer(seconds: float) -> measure.Timer:
    """A timer that reports ``seconds`` for every call, without calling: recorded figures in place of a GPU."""

    def timer(fn: Callable[[], object], warmup: int, iterations: int) -> list[float]:
        return [seconds] * iterations

    return timer


def test_attempt_outcomes() -> None:
    attempt = measure._Attempt(torch)

    def declined() -> None:
        warnings.warn("Flash attention kernel not used because: head_dim 7 not supported", stacklevel=1)
        raise RuntimeError("No available kernel. Aborting execution.")

    def broken() -> None:
        raise RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED")

    def oom() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")

    assert attempt.run(lambda: None, fixed_timer(2e-3), 1, 3) == ([2e-3] * 3, "ok", None)
    assert attempt.run(declined, fixed_timer(1.0), 1, 3) == (
        None, "unavailable", "Flash attention kernel not used because: head_dim 7 not supported")  # fmt: skip
    assert attempt.run(broken, fixed_timer(1.0), 1, 3) == (
        None, "error", "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED")  # fmt: skip
    assert attempt.run(oom, fixed_timer(1.0), 1, 3) == (None, "error", "out of memory")
    assert measure.one_line("a\n  b " + "x" * 200) == "a b " + "x" * 155 + "…"


def test_rows_from_injected_times_on_cpu_kernels() -> None:
    shape = LLAMA_8B.model_copy(update={"heads": 2, "head_dim": 16, "hidden": 64, "kv_heads": 1, "intermediate": 128})
    plan = build_plan(shape, quick=True, causal=False, attention=((32, 2),), contexts=(64,), decode_batch=2,
                      prefill_tokens=16, decode_tokens=2, iterations=4)  # fmt: skip
    peak, hbm = 1e12, 1e11
    rows = measure.attention(torch, plan, "cpu", fixed_timer(1e-3), peak)
    math = next(r for r in rows if r.backend == "math")
    flops = counts.attention_flops(2, 2, 32, 16, causal=False)
    assert (math.status, math.median_seconds, math.flops) == ("ok", 1e-3, flops)
    assert math.tflops == flops / 1e-3 / 1e12
    assert math.share_of_peak == flops / 1e-3 / peak
    decode = next(r for r in measure.decode(torch, plan, "cpu", fixed_timer(1e-4), hbm) if r.backend == "math")
    assert decode.gb_per_s == 2 * 2 * 2 * 64 * 16 * 2 / 1e-4 / 1e9
    assert decode.share_of_hbm == 2 * 2 * 2 * 64 * 16 * 2 / 1e-4 / hbm
    roof = measure.roofline(torch, plan, "cpu", fixed_timer(1e-5), peak, hbm)
    assert [(r.op, r.phase, r.label, r.m, r.n, r.k) for r in roof] == [
        ("gemm", "prefill", "q_proj", 16, 32, 64), ("gemm", "prefill", "gate_proj", 16, 128, 64),
        ("gemm", "prefill", "down_proj", 16, 64, 128), ("gemm", "decode", "q_proj", 2, 32, 64),
        ("gemm", "decode", "gate_proj", 2, 128, 64), ("gemm", "decode", "down_proj", 2, 64, 128),
        ("copy", "prefill", "activations 16×128", None, None, None),
        ("copy", "decode", "one layer's weights", None, None, None)]  # fmt: skip
    # one layer: q 64x32, k and v 64x16, o 32x64, gate and up 64x128, down 128x64
    assert roof[-1].bytes == 2 * (64 * 32 + 2 * 64 * 16 + 32 * 64 + 3 * 64 * 128) * 2
    assert roof[1].tflops == counts.gemm_flops(16, 128, 64) / 1e-5 / 1e12


def test_math_backend_skips_huge_score_matrices() -> None:
    # 4 · 32 · 8192² · 2 bytes = 16 GiB of scores at the guide's largest shape; 2,048×16 is 4 GiB.
    assert measure._math_skip(4, 32, 8192, "bf16") == "skipped: the math backend would materialise 16 GiB of scores"
    assert measure._math_skip(16, 32, 2048, "bf16") is None
