"""The MFU estimate: FLOPs and HBM bytes of engine steps from the model's shape and the tokens the steps
compute, with the terms vLLM 0.32 counts for ``vllm:estimated_{flops,read_bytes,write_bytes}_per_gpu_total``
(``--enable-mfu-metrics``; its analytic model in ``vllm/v1/metrics/perf.py``). One home for the sim's
counters (per step, :func:`step_work`) and the proxy's (per request, :func:`request_work`), docs/metrics.md.

A step is a list of entries (tokens computed ``n``, context length after them ``ctx``, prefill or decode). With
L layers, hidden D, q heads, k KV heads, head dim d, MLP width I, vocabulary V, 16-bit activations and KV cache
(a = c = 2 bytes) and weights of w bytes, T tokens, TC = Σ n·ctx, R = logits rows (one per prefill entry plus
every decode token):

- FLOPs: 2·T·D·(q+2k)·d·L (QKV) + 2·T·D·q·d·L (output projection) + 4·q·d·L·TC (QKᵀ and PV, the whole context
  per token, no causal halving) + 6·T·D·I·L (gated MLP) + 2·R·D·V (LM head).
- Read: per step once, the weights: (D·(q+2k)·d + q·d·D + 3·D·I)·w·L + D·V·a (LM head, 16-bit); per token the
  layer inputs (T·D·a·L for QKV, T·q·d·a·L for the output projection, (T·D + 3·T·I)·a·L for the MLP, R·D·a for
  the LM head); attention: prefill (Tp·q + 2·Cp·k)·d·a·L, decode Td·q·d·a·L + 2·Cd·k·d·c·L (Cp, Cd: Σ ctx).
- Written: T·(q+2k)·d·a·L (QKV) + 2·T·k·d·c·L (new K and V into the cache) + T·D·a·L (attention output)
  + (3·T·I + T·D)·a·L (MLP) + R·V·a (logits).

Per GPU with tensor and pipeline parallelism 1 (the whole model on one GPU); dense models only.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadlens.contracts.model_config import DTYPE_BYTES, ModelConfig, ModelConfigError

ACT_BYTES = DTYPE_BYTES
CACHE_BYTES = DTYPE_BYTES


@dataclass(frozen=True, slots=True)
class Shape:
    """What the estimate needs of a model; :func:`shape` checks a :class:`ModelConfig` has it."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    weight_bytes: float


def shape(config: ModelConfig) -> Shape:
    """The estimate's shape of a model; :class:`ModelConfigError` (one line, the file and field) when the
    config lacks what the estimate needs."""
    if config.intermediate is None:
        raise ModelConfigError(
            f"{config.name}: field {config.moe_key!r}: a mixture-of-experts model; the MFU estimate counts dense "
            "MLPs only"
        )
    if config.vocab is None:
        raise ModelConfigError(f"{config.name}: field 'vocab_size' is missing (the LM head's size)")
    if config.weight_bytes is None:
        raise ModelConfigError(
            f"{config.name}: field 'quantization_config.quant_method' is not a method the MFU estimate knows"
        )
    return Shape(config.layers, config.hidden, config.heads, config.kv_heads, config.head_dim, config.intermediate,
                 config.vocab, config.weight_bytes)  # fmt: skip


@dataclass(slots=True)
class Work:
    """Tokens computed, aggregated over entries; ``steps`` counts the weight reads (one per engine step)."""

    steps: float = 0.0
    prefill_tokens: int = 0
    prefill_entries: int = 0
    prefill_context: int = 0
    decode_tokens: int = 0
    decode_context: int = 0
    token_context: int = 0

    def add(self, num_tokens: int, context_len: int, *, prefill: bool) -> None:
        """One request's share of a step: ``num_tokens`` computed, ``context_len`` tokens in its context after
        them."""
        if prefill:
            self.prefill_tokens += num_tokens
            self.prefill_entries += 1
            self.prefill_context += context_len
        else:
            self.decode_tokens += num_tokens
            self.decode_context += context_len
        self.token_context += num_tokens * context_len


@dataclass(frozen=True, slots=True)
class Estimate:
    flops: float
    read_bytes: float
    write_bytes: float


NOTHING = Estimate(0.0, 0.0, 0.0)
"""What a step adds where the estimate is off."""


def request_work(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> Work:
    """A request's steps as vLLM runs them unchunked: one prefill of the uncached prompt (context: the whole
    prompt), then one decode step per output token after the first (context: prompt + tokens so far); one
    weight read per step (``steps``: the caller scales it by its share of the batch)."""
    work = Work()
    work.add(max(1, prompt_tokens - cached_tokens), prompt_tokens, prefill=True)
    decodes = max(0, output_tokens - 1)
    work.decode_tokens = decodes
    work.decode_context = decodes * prompt_tokens + decodes * (decodes + 1) // 2
    work.token_context += work.decode_context
    work.steps = 1.0 + decodes
    return work


def weight_read_bytes(s: Shape) -> float:
    """Bytes of weights one step reads: the decoder's linear layers and the LM head."""
    per_layer = (s.hidden * (s.heads + 2 * s.kv_heads) * s.head_dim + s.heads * s.head_dim * s.hidden) * s.weight_bytes
    per_layer += 3 * s.hidden * s.intermediate * s.weight_bytes
    return per_layer * s.layers + s.hidden * s.vocab * ACT_BYTES


def estimate(s: Shape, w: Work) -> Estimate:
    """FLOPs, bytes read and bytes written for ``w`` (the module's docstring has the terms)."""
    L, D, q, k, d, inter, V = s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab
    a, c = ACT_BYTES, CACHE_BYTES
    T = w.prefill_tokens + w.decode_tokens
    rows = w.prefill_entries + w.decode_tokens
    flops = (2 * T * D * (q + 2 * k) * d * L + 2 * T * D * q * d * L + 4 * q * d * L * w.token_context
             + 6 * T * D * inter * L + 2 * rows * D * V)  # fmt: skip
    attention = (w.prefill_tokens * q + 2 * w.prefill_context * k) * d * a * L if w.prefill_tokens else 0
    if w.decode_tokens:
        attention += w.decode_tokens * q * d * a * L + 2 * w.decode_context * k * d * c * L
    per_token = (T * D + T * q * d + T * D + 3 * T * inter) * a * L + rows * D * a
    read = w.steps * weight_read_bytes(s) + attention + per_token
    write = (T * (q + 2 * k) * d * a + 2 * T * k * d * c + T * D * a + (3 * T * inter + T * D) * a) * L + rows * V * a
    return Estimate(float(flops), float(read), float(write))
