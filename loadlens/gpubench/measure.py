"""The timed kernels: prefill attention and decode per SDPA backend (and the ``flash_attn`` package when
installed), GEMM and copy roofline points. Random data on the device, nothing downloaded. Each kernel is
timed by a :data:`Timer` (CUDA events on a GPU; ``perf_counter`` in the CPU smoke test) and turned into rows
by ``counts.py``, so the arithmetic is tested without a GPU.

A backend that cannot run a shape or dtype (PyTorch raises "No available kernel", with its reasons as
warnings) gives an ``unavailable`` row with the first reason; running out of memory gives an ``error`` row.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from typing import Any

from loadlens.contracts.gpu_bench_result import AttentionRow, DecodeRow, RooflineRow
from loadlens.gpubench import counts
from loadlens.gpubench.plan import FLASH_ATTN, MATH_SCORE_LIMIT_BYTES, SDPA_BACKENDS, Plan

Timer = Callable[[Callable[[], object], int, int], list[float]]
"""``timer(fn, warmup, iterations)`` -> seconds of each timed call."""
REASON_CHARS = 160


def cuda_timer(torch: Any) -> Timer:
    """CUDA events around each call, one synchronisation after the timed calls."""

    def timer(fn: Callable[[], object], warmup: int, iterations: int) -> list[float]:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        marks = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iterations)
        ]
        for start, end in marks:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in marks]

    return timer


def cpu_timer() -> Timer:
    def timer(fn: Callable[[], object], warmup: int, iterations: int) -> list[float]:
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out

    return timer


def one_line(text: str) -> str:
    line = " ".join(text.strip().split())
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"


def dtype_of(torch: Any, name: str) -> Any:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def sdpa_backends(torch: Any) -> dict[str, Any]:
    """Our backend names -> ``SDPBackend`` members this torch has."""
    from torch.nn.attention import SDPBackend

    names = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
             "math": "MATH"}  # fmt: skip
    return {ours: getattr(SDPBackend, member) for ours, member in names.items() if hasattr(SDPBackend, member)}


def flash_attn_func() -> Callable[..., Any] | None:
    try:
        from flash_attn import flash_attn_func as func
    except Exception:  # not installed, or built for another torch/CUDA
        return None
    return func  # type: ignore[no-any-return]


NO_KERNEL = ("No available kernel", "No viable backend")
"""How PyTorch says that none of the allowed SDPA backends takes the call."""


class _Attempt:
    """Runs one kernel: its timings, or why not (``status`` and ``reason``)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def run(
        self,
        fn: Callable[[], object],
        timer: Timer,
        warmup: int,
        iterations: int,
        context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> tuple[list[float] | None, str, str | None]:
        """``context`` (the ``sdpa_kernel`` choice) is entered once around the first call and the timing, so
        its cost is not in the timed calls."""
        torch = self.torch
        try:
            with context():
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        fn()  # the first call says whether the backend takes this shape
                    except RuntimeError as err:
                        if isinstance(err, torch.OutOfMemoryError) or not any(m in str(err) for m in NO_KERNEL):
                            raise
                        # PyTorch says why each backend declined in warnings, then raises "No available kernel".
                        messages = [str(w.message) for w in caught]
                        return None, "unavailable", one_line("; ".join(messages) or str(err))
                return timer(fn, warmup, iterations), "ok", None
        except torch.OutOfMemoryError:
            return None, "error", "out of memory"
        except RuntimeError as err:  # a kernel that failed to run (not a declined backend): say so, go on
            return None, "error", one_line(str(err))
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def _flash_call(fa: Callable[..., Any], q: Any, k: Any, v: Any, causal: bool) -> Callable[[], object]:
    """flash_attn takes (batch, seq, heads, dim); the copies are made once, outside the timing."""
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    return lambda: fa(qt, kt, vt, causal=causal)


def _matmul_call(torch: Any, a: Any, b: Any) -> Callable[[], object]:
    return lambda: torch.matmul(a, b)


def _copy_call(dst: Any, src: Any) -> Callable[[], object]:
    return lambda: dst.copy_(src)


def _math_skip(batch: int, heads: int, seq: int, dtype: str) -> str | None:
    scores = counts.score_matrix_bytes(batch, heads, seq, dtype)
    if scores <= MATH_SCORE_LIMIT_BYTES:
        return None
    return f"skipped: the math backend would materialise {scores / 2**30:.0f} GiB of scores"


def _sdpa_call(torch: Any, q: Any, k: Any, v: Any, causal: bool) -> Callable[[], object]:
    from torch.nn.functional import scaled_dot_product_attention

    return lambda: scaled_dot_product_attention(q, k, v, is_causal=causal)


def _only(backend: Any) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """``sdpa_kernel`` allowing ``backend`` alone, so PyTorch cannot fall back to another."""
    from torch.nn.attention import sdpa_kernel

    return lambda: sdpa_kernel(backend)


def attention(torch: Any, plan: Plan, device: str, timer: Timer, peak: float | None) -> list[AttentionRow]:
    """Guide 3.1: every (backend, dtype, shape) of the plan, non-causal unless ``plan.causal``."""
    heads, d = plan.model.heads, plan.model.head_dim
    backends = sdpa_backends(torch)
    fa = flash_attn_func() if device == "cuda" else None
    attempt = _Attempt(torch)
    rows: list[AttentionRow] = []
    for dtype in plan.dtypes:
        for seq, batch in plan.attention:
            shape = dict(dtype=dtype, seq_len=seq, batch=batch, heads=heads, head_dim=d, causal=plan.causal)
            q, k, v = (torch.randn(batch, heads, seq, d, device=device, dtype=dtype_of(torch, dtype)) for _ in range(3))
            for name in (*SDPA_BACKENDS, FLASH_ATTN):
                seconds: list[float] | None = None
                status, reason = "unavailable", None
                fn: Callable[[], object] | None = None
                scope: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
                if name == FLASH_ATTN:
                    if fa is None:
                        continue  # not installed: no row (docs/gpu-bench.md)
                    fn = _flash_call(fa, q, k, v, plan.causal)
                elif name not in backends:
                    reason = f"this torch has no SDPBackend for {name}"
                elif name == "math" and _math_skip(batch, heads, seq, dtype):
                    reason = _math_skip(batch, heads, seq, dtype)
                else:
                    fn, scope = _sdpa_call(torch, q, k, v, plan.causal), _only(backends[name])
                if fn is not None:
                    seconds, status, reason = attempt.run(fn, timer, plan.warmup, plan.iterations, scope)
                rows.append(counts.attention_row(name, **shape, seconds=seconds, peak_flops=peak, reason=reason,  # type: ignore[arg-type]
                                                 status=status))  # fmt: skip
            del q, k, v
    return rows


def decode(torch: Any, plan: Plan, device: str, timer: Timer, hbm: float | None) -> list[DecodeRow]:
    """Guide 3.2: one query token against ``context`` cached tokens per sequence, K+V bytes read per second."""
    heads, d, batch = plan.model.heads, plan.model.head_dim, plan.decode_batch
    backends = sdpa_backends(torch)
    fa = flash_attn_func() if device == "cuda" else None
    attempt = _Attempt(torch)
    rows: list[DecodeRow] = []
    for dtype in plan.dtypes:
        for context in plan.contexts:
            shape = dict(dtype=dtype, context=context, batch=batch, heads=heads, head_dim=d)
            dt = dtype_of(torch, dtype)
            q = torch.randn(batch, heads, 1, d, device=device, dtype=dt)
            k, v = (torch.randn(batch, heads, context, d, device=device, dtype=dt) for _ in range(2))
            for name in (*SDPA_BACKENDS, FLASH_ATTN):
                seconds: list[float] | None = None
                status, reason = "unavailable", None
                fn: Callable[[], object] | None = None
                scope: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
                if name == FLASH_ATTN:
                    if fa is None:
                        continue
                    fn = _flash_call(fa, q, k, v, False)
                elif name not in backends:
                    reason = f"this torch has no SDPBackend for {name}"
                else:
                    fn, scope = _sdpa_call(torch, q, k, v, False), _only(backends[name])
                if fn is not None:
                    seconds, status, reason = attempt.run(fn, timer, plan.warmup, plan.iterations, scope)
                rows.append(counts.decode_row(name, **shape, seconds=seconds, hbm=hbm, reason=reason, status=status))  # type: ignore[arg-type]
            del q, k, v
    return rows


def roofline(
    torch: Any, plan: Plan, device: str, timer: Timer, peak: float | None, hbm: float | None
) -> list[RooflineRow]:
    """GEMM points at prefill-like (m = prefill tokens) and decode-like (m = decode batch) shapes of the model's
    linear modules, and copy points; in the first dtype of the plan."""
    dtype = plan.dtypes[0]
    dt = dtype_of(torch, dtype)
    attempt = _Attempt(torch)
    rows: list[RooflineRow] = []
    for case in plan.gemms:
        a = torch.randn(case.m, case.k, device=device, dtype=dt)
        b = torch.randn(case.k, case.n, device=device, dtype=dt)
        seconds, status, reason = attempt.run(_matmul_call(torch, a, b), timer, plan.warmup, plan.iterations)
        rows.append(counts.gemm_row(case.phase, case.label, case.m, case.n, case.k, dtype, seconds=seconds,
                                    peak_flops=peak, hbm=hbm, reason=reason, status=status))  # fmt: skip
        del a, b
    for copy in plan.copies:
        src = torch.randn(copy.numel, device=device, dtype=dt)
        dst = torch.empty_like(src)
        seconds, status, reason = attempt.run(_copy_call(dst, src), timer, plan.warmup, plan.iterations)
        rows.append(counts.copy_row(copy.phase, copy.label, copy.numel, dtype, seconds=seconds, hbm=hbm,
                                    reason=reason, status=status))  # fmt: skip
        del src, dst
    return rows
