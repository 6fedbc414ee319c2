"""Batch shapes and predicates the roofline tests price (test-only: the engine builds its shapes in the
scheduler)."""

from __future__ import annotations

from exporters.serving.engines.sim.roofline import BatchShape, StepCost, attn_pairs


def prefill_shape(prompt_tokens: int, *, cached_tokens: int = 0, images: int = 0) -> BatchShape:
    """One sequence prefilling ``prompt_tokens`` (after ``cached_tokens`` prefix-cache hits) in one step."""
    new = prompt_tokens - cached_tokens
    return BatchShape(
        num_tokens=new,
        num_seqs=1,
        num_sampled=1,
        attn_pairs=attn_pairs(new, cached_tokens),
        kv_read_tokens=cached_tokens,
        images=images,
    )


def decode_shape(batch: int, context: int) -> BatchShape:
    """``batch`` sequences each decoding one token after ``context`` cached tokens."""
    return BatchShape(
        num_tokens=batch,
        num_seqs=batch,
        num_sampled=batch,
        attn_pairs=batch * attn_pairs(1, context),
        kv_read_tokens=batch * context,
    )


def compute_bound(cost: StepCost) -> bool:
    return cost.compute_seconds >= cost.memory_seconds
