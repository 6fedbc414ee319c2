"""What gpu-bench runs: the guide's shapes by default, the model's linear modules for the GEMM points, and the
short form (``--quick``) that ``make gpu-check`` runs. Pure data, built from the flags."""

from __future__ import annotations

from dataclasses import dataclass

from loadlens.contracts.gpu_bench_result import ModelShape

# Guide 3.1: (sequence length, batch); 3.2: batch 8, one query token, these contexts.
GUIDE_ATTENTION: tuple[tuple[int, int], ...] = ((512, 64), (2048, 16), (8192, 4))
GUIDE_CONTEXTS: tuple[int, ...] = (2048, 4096, 8192)
GUIDE_DECODE_BATCH = 8
# The 3.3 anchor: an 8-layer 1024-wide stack, batch 32, one token.
GRAPH_LAYERS, GRAPH_WIDTH, GRAPH_BATCH = 8, 1024, 32
SDPA_BACKENDS: tuple[str, ...] = ("cudnn", "flash", "efficient", "math")
FLASH_ATTN = "flash_attn"
"""The ``flash_attn`` package (FlashAttention 2), measured beside the SDPA backends when installed."""
MATH_SCORE_LIMIT_BYTES = 8 * 2**30
"""The math backend materialises the b·h·s² scores (and a softmax copy); shapes above this are skipped."""
PREFILL_TOKENS = 4096
DECODE_TOKENS = 8


@dataclass(frozen=True)
class GemmCase:
    phase: str
    label: str
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class CopyCase:
    phase: str
    label: str
    numel: int


@dataclass(frozen=True)
class Plan:
    model: ModelShape
    dtypes: tuple[str, ...]
    attention: tuple[tuple[int, int], ...]
    contexts: tuple[int, ...]
    decode_batch: int
    gemms: tuple[GemmCase, ...]
    copies: tuple[CopyCase, ...]
    graph_layers: int
    graph_width: int
    graph_batch: int
    warmup: int
    iterations: int
    quick: bool
    causal: bool


def linear_modules(model: ModelShape) -> list[tuple[str, int, int]]:
    """(name, d_in, d_out) of the linear modules measured: the query projection and, with a dense MLP, the up
    and down projections (the largest matmuls of a layer)."""
    out = [("q_proj", model.hidden, model.heads * model.head_dim)]
    if model.intermediate is not None:
        out += [("gate_proj", model.hidden, model.intermediate), ("down_proj", model.intermediate, model.hidden)]
    return out


def gemm_cases(model: ModelShape, prefill_tokens: int, decode_tokens: int) -> tuple[GemmCase, ...]:
    cases = [GemmCase("prefill", name, prefill_tokens, d_out, d_in) for name, d_in, d_out in linear_modules(model)]
    cases += [GemmCase("decode", name, decode_tokens, d_out, d_in) for name, d_in, d_out in linear_modules(model)]
    return tuple(cases)


def copy_cases(model: ModelShape, prefill_tokens: int) -> tuple[CopyCase, ...]:
    """Prefill-like: the widest activation a prefill writes (tokens × intermediate, or × hidden without a
    dense MLP). Decode-like: one layer's linear weights, what a decode step streams per layer."""
    width = model.intermediate if model.intermediate is not None else model.hidden
    layer_weights = sum(d_in * d_out for _, d_in, d_out in linear_modules(model))
    if model.intermediate is not None:
        layer_weights += model.hidden * model.intermediate  # up_proj, the same shape as gate_proj
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    layer_weights += 2 * model.hidden * kv + q * model.hidden  # k_proj, v_proj, o_proj
    return (
        CopyCase("prefill", f"activations {prefill_tokens}×{width}", prefill_tokens * width),
        CopyCase("decode", "one layer's weights", layer_weights),
    )


def build_plan(
    model: ModelShape,
    *,
    quick: bool,
    causal: bool,
    dtypes: tuple[str, ...] | None = None,
    attention: tuple[tuple[int, int], ...] = GUIDE_ATTENTION,
    contexts: tuple[int, ...] = GUIDE_CONTEXTS,
    decode_batch: int = GUIDE_DECODE_BATCH,
    prefill_tokens: int = PREFILL_TOKENS,
    decode_tokens: int = DECODE_TOKENS,
    graph: tuple[int, int, int] = (GRAPH_LAYERS, GRAPH_WIDTH, GRAPH_BATCH),
    warmup: int | None = None,
    iterations: int | None = None,
) -> Plan:
    """The full form: bf16 and fp16, 3 warm-ups and 20 timed iterations (the issue's anchors were taken so);
    ``quick``: bf16 only, 2 and 10."""
    chosen = dtypes if dtypes is not None else (("bf16",) if quick else ("bf16", "fp16"))
    return Plan(
        model=model,
        dtypes=chosen,
        attention=attention,
        contexts=contexts,
        decode_batch=decode_batch,
        gemms=gemm_cases(model, prefill_tokens, decode_tokens),
        copies=copy_cases(model, prefill_tokens),
        graph_layers=graph[0],
        graph_width=graph[1],
        graph_batch=graph[2],
        warmup=warmup if warmup is not None else (2 if quick else 3),
        iterations=iterations if iterations is not None else (10 if quick else 20),
        quick=quick,
        causal=causal,
    )
