"""Roofline cost model of one engine step, and the KV-cache and memory arithmetic behind it.

Pure functions of a :class:`ModelProfile`, a :class:`GPUProfile` and a :class:`BatchShape`. All times are
modeled seconds (the engine divides by ``speed``). The formulas, with P = linear (matmul) parameters:

- compute FLOPs    = 2·P·tokens + 2·vocab·hidden·sampled + 4·layers·heads·head_dim·attn_pairs
                     + images·vision_flops_per_image
- compute seconds  = FLOPs / (peak_tensor_flops · compute_efficiency)
- memory bytes     = streamed weights + kv_bytes_per_token·(context read + tokens written)
- memory seconds   = bytes / (hbm_bytes_per_s · memory_efficiency)
- step seconds     = stall + overhead + max(compute, memory) + lora + dequant

``attn_pairs`` counts (query, key) pairs under the causal mask: a chunk of q new tokens after c cached ones
contributes q·c + q(q+1)/2. Prefill is compute-bound (tokens large), decode memory-bound (weights are read
once per step whatever the batch), so decode throughput grows with the batch until the two terms cross.

LoRA (guide 2.1): per distinct adapter in the batch, a launch cost per target module per layer, plus its
matmuls, 2·adapter_params FLOPs per token, run at an efficiency that grows with rank as r^0.4 (thin
shrink/expand matmuls are latency-bound), so LoRA time per token grows as r^0.6: sub-linearly, like the
guide's 1.2 / 2.9 / 6.7 ms at r = 2 / 8 / 32. AWQ: 4-bit weights (plus a 16-bit scale and 4-bit zero per
group of 128) stream 3.8x fewer bytes but are dequantised every step on the CUDA cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exporters.serving.engines.sim.profile import GPUProfile
from loadlens.contracts.model_profile import ModelProfile

BLOCK_SIZE = 16
"""Tokens per KV-cache block (vLLM's default ``block_size``)."""
KV_DTYPE_BYTES = 2
"""The KV cache is kept in 16-bit floats whatever the weight format."""
ACT_DTYPE_BYTES = 2
AWQ_GROUP_SIZE = 128
AWQ_BYTES_PER_PARAM = 0.5 + (2 + 0.5) / AWQ_GROUP_SIZE
"""4-bit weight plus, per group of 128, one fp16 scale and one 4-bit zero point."""
AWQ_DEQUANT_OPS_PER_PARAM = 4.0
"""Shift, mask, subtract zero, multiply scale."""
LORA_DTYPE_BYTES = 2
LORA_RANK_EXPONENT = 0.6
"""LoRA time per token ~ r^0.6, fitted to guide 2.1 (2.9/1.2 = 2.4 and 6.7/2.9 = 2.3 per 4x rank)."""
LORA_REFERENCE_RANK = 16


@dataclass(frozen=True, slots=True)
class LoraWork:
    """One distinct adapter in a step: its size and how many of the step's tokens use it."""

    params: int
    modules_per_layer: int
    rank: int
    tokens: int


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one step computes, aggregated over its sequences."""

    num_tokens: int
    """Tokens computed this step: prefill chunks plus one per decoding sequence."""
    num_seqs: int
    num_sampled: int
    """Sequences that sample a token at the end of the step (LM-head rows)."""
    attn_pairs: int
    kv_read_tokens: int
    """Tokens of already-cached context whose K and V are read."""
    images: int = 0
    lora: tuple[LoraWork, ...] = ()


@dataclass(frozen=True, slots=True)
class StepCost:
    compute_seconds: float
    memory_seconds: float
    overhead_seconds: float
    lora_seconds: float
    dequant_seconds: float
    stall_seconds: float
    flops: float
    bytes_moved: float

    @property
    def busy_seconds(self) -> float:
        """Time kernels run (what NVML utilisation counts): everything but host overhead and stalls."""
        return max(self.compute_seconds, self.memory_seconds) + self.lora_seconds + self.dequant_seconds

    @property
    def total_seconds(self) -> float:
        return self.stall_seconds + self.overhead_seconds + self.busy_seconds


# --- sizes --------------------------------------------------------------------------------------------------


def linear_params(model: ModelProfile) -> int:
    """Decoder matmul parameters (every token multiplies through all of them)."""
    return model.layers * model.layer_linear_params()


def lm_head_params(model: ModelProfile) -> int:
    return model.vocab * model.hidden


def weight_bytes(model: ModelProfile) -> int:
    """Bytes of weights on the GPU. AWQ quantises the decoder linears; embeddings and vision stay 16-bit."""
    if model.dtype != "awq-4bit":
        return model.params * 2
    quantised = linear_params(model)
    return int(quantised * AWQ_BYTES_PER_PARAM) + (model.params - quantised) * 2


def streamed_weight_bytes(model: ModelProfile, *, images: bool) -> int:
    """Weights read once per step: decoder linears and the LM head (the input embedding is a gather), plus
    the vision tower when the step encodes images."""
    per_param = AWQ_BYTES_PER_PARAM if model.dtype == "awq-4bit" else 2.0
    vision = model.vision_params * 2 if images else 0
    return int(linear_params(model) * per_param) + lm_head_params(model) * 2 + vision


def kv_bytes_per_token(model: ModelProfile) -> int:
    """K and V for every layer: 2 · layers · kv_heads · head_dim · 2 bytes."""
    return 2 * model.layers * model.kv_heads * model.head_dim * KV_DTYPE_BYTES


def kv_block_bytes(model: ModelProfile) -> int:
    return BLOCK_SIZE * kv_bytes_per_token(model)


def activation_bytes(model: ModelProfile, num_tokens: int, num_seqs: int) -> int:
    """Peak activation working set of one forward pass: per token the residual stream, q/k/v, the gated MLP's
    two intermediate tensors and the attention output, plus fp32 logits for each sampled sequence."""
    per_token = (4 * model.hidden + model.q_dim + 2 * model.kv_dim + 2 * model.intermediate) * ACT_DTYPE_BYTES
    return num_tokens * per_token + num_seqs * model.vocab * 4


def kv_cache_bytes_available(
    model: ModelProfile, gpu: GPUProfile, gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """vLLM's budget: total × utilisation − weights − profiled activation peak − non-torch memory."""
    budget = int(gpu.memory_bytes * gpu_memory_utilization)
    peak = activation_bytes(model, max_num_batched_tokens, max_num_seqs)
    return budget - weight_bytes(model) - peak - gpu.cuda_context_bytes


def num_gpu_blocks(
    model: ModelProfile, gpu: GPUProfile, gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """KV-cache blocks that fit; may be <= 0 when the weights alone do not fit (callers report that)."""
    available = kv_cache_bytes_available(model, gpu, gpu_memory_utilization, max_num_batched_tokens, max_num_seqs)
    return available // kv_block_bytes(model)


def adapter_params(model: ModelProfile, rank: int, target_modules: Sequence[str]) -> int:
    """layers × Σ over target modules of r·(d_in + d_out) (guide 2.1's sizing rule)."""
    per_layer = sum(rank * sum(model.module_dims(m)) for m in target_modules)
    return model.layers * per_layer


def adapter_module_bytes(model: ModelProfile, rank: int, target_modules: Sequence[str]) -> list[int]:
    """One allocation per (layer, target module): A and B together, 16-bit."""
    sizes = [rank * sum(model.module_dims(m)) * LORA_DTYPE_BYTES for m in target_modules]
    return sizes * model.layers


# --- times --------------------------------------------------------------------------------------------------


def attn_pairs(num_new: int, num_context: int) -> int:
    """Causal (query, key) pairs for ``num_new`` tokens appended after ``num_context`` cached ones."""
    return num_new * num_context + num_new * (num_new + 1) // 2


def lora_seconds(model: ModelProfile, gpu: GPUProfile, work: Sequence[LoraWork]) -> float:
    total = 0.0
    for w in work:
        launches = model.layers * w.modules_per_layer * gpu.lora_kernel_overhead_seconds
        eff = gpu.lora_compute_efficiency * (w.rank / LORA_REFERENCE_RANK) ** (1.0 - LORA_RANK_EXPONENT)
        eff = min(eff, gpu.compute_efficiency)
        compute = 2.0 * w.params * w.tokens / (gpu.peak_tensor_flops * eff)
        memory = w.params * LORA_DTYPE_BYTES / (gpu.hbm_bytes_per_s * gpu.memory_efficiency)
        total += launches + max(compute, memory)
    return total


def dequant_seconds(model: ModelProfile, gpu: GPUProfile) -> float:
    if model.dtype != "awq-4bit":
        return 0.0
    ops = linear_params(model) * AWQ_DEQUANT_OPS_PER_PARAM
    return ops / (gpu.vector_flops * gpu.compute_efficiency)


def overhead_seconds(model: ModelProfile, gpu: GPUProfile, num_seqs: int) -> float:
    return (
        gpu.step_overhead_seconds + gpu.per_seq_overhead_seconds * num_seqs + gpu.layer_overhead_seconds * model.layers
    )


def step_cost(model: ModelProfile, gpu: GPUProfile, shape: BatchShape, *, stall_seconds: float = 0.0) -> StepCost:
    """Modeled duration of one step, split into its terms."""
    flops = (
        2.0 * linear_params(model) * shape.num_tokens
        + 2.0 * lm_head_params(model) * shape.num_sampled
        + 4.0 * model.layers * model.heads * model.head_dim * shape.attn_pairs
        + shape.images * model.vision_flops_per_image
    )
    kv = kv_bytes_per_token(model)
    moved = streamed_weight_bytes(model, images=shape.images > 0) + kv * (shape.kv_read_tokens + shape.num_tokens)
    return StepCost(
        compute_seconds=flops / (gpu.peak_tensor_flops * gpu.compute_efficiency),
        memory_seconds=moved / (gpu.hbm_bytes_per_s * gpu.memory_efficiency),
        overhead_seconds=overhead_seconds(model, gpu, shape.num_seqs),
        lora_seconds=lora_seconds(model, gpu, shape.lora),
        dequant_seconds=dequant_seconds(model, gpu),
        stall_seconds=stall_seconds,
        flops=flops,
        bytes_moved=float(moved),
    )


def adapter_read_seconds(gpu: GPUProfile, nbytes: int) -> float:
    """Reading an adapter's weights from storage into the host cache (``load_lora_adapter``, CPU-cache miss)."""
    return nbytes / gpu.adapter_read_bytes_per_s


def adapter_activate_seconds(gpu: GPUProfile, nbytes: int, *, from_disk: bool) -> float:
    """Putting an adapter into a GPU slot: fixed cost + host→device copy, plus a storage read on a CPU-cache
    miss. The compute stream waits for all of it (the guide's cudaMallocAsync synchronisation point)."""
    seconds = gpu.adapter_load_fixed_seconds + nbytes / gpu.host_to_device_bytes_per_s
    return seconds + (adapter_read_seconds(gpu, nbytes) if from_disk else 0.0)
