"""KV-cache sizing from the knobs, against the model and the GPU, and the ``vllm:cache_config_info`` labels
that describe the result."""

from __future__ import annotations

from exporters.serving.engine import EngineError, ErrorKind
from exporters.serving.engines.sim import roofline
from exporters.serving.engines.sim.knobs import Knobs
from exporters.serving.engines.sim.profile import GPUProfile, ModelProfile, ProfileError
from exporters.serving.engines.sim.roofline import BLOCK_SIZE
from exporters.serving.engines.sim.sched_types import cdiv


def require_kv_room(model: ModelProfile, gpu: GPUProfile, k: Knobs) -> None:
    """A model whose weights leave no room for a KV cache is a profile error (it names the model's dtype)."""
    available = roofline.kv_cache_bytes_available(
        model, gpu, k.gpu_memory_utilization, k.max_num_batched_tokens, k.max_num_seqs
    )
    if available <= 0:
        raise ProfileError(
            f"profile {model.path or model.name}: field 'dtype': {roofline.weight_bytes(model) / 2**30:.1f} GiB "
            f"of {model.dtype} weights leave no room for a KV cache on {gpu.name} "
            f"({gpu.memory_bytes / 2**30:.0f} GiB x gpu_memory_utilization {k.gpu_memory_utilization})"
        )


def blocks_for(model: ModelProfile, gpu: GPUProfile, k: Knobs, override: int | None, *, param: str) -> int:
    """Blocks of the KV cache: ``override`` if it fits next to the weights, else what the memory budget
    leaves. Either way it must hold one ``max_model_len`` sequence (as vLLM refuses to start otherwise, so
    preemption can never deadlock); errors name ``param``."""
    if override is not None:
        most = roofline.num_gpu_blocks(model, gpu, 1.0, k.max_num_batched_tokens, k.max_num_seqs)
        if override > most:
            raise EngineError(
                ErrorKind.INVALID_REQUEST,
                f"knob num_gpu_blocks: {override} blocks of {roofline.kv_block_bytes(model)} bytes do not fit on "
                f"{gpu.name} next to the weights and activations (at most {most})",
                param="num_gpu_blocks",
            )
        blocks = override
    else:
        blocks = roofline.num_gpu_blocks(model, gpu, k.gpu_memory_utilization, k.max_num_batched_tokens, k.max_num_seqs)
    needed = cdiv(k.max_model_len, BLOCK_SIZE)
    if blocks < needed:
        raise EngineError(
            ErrorKind.INVALID_REQUEST,
            f"knob {param}: the model's max seq len ({k.max_model_len}) is larger than the maximum number of "
            f"tokens that can be stored in KV cache ({max(blocks, 0) * BLOCK_SIZE}). Try increasing "
            "gpu_memory_utilization or decreasing max_model_len.",
            param=param,
        )
    return blocks


def cache_config_info(k: Knobs, override: int | None) -> dict[str, str]:
    """vLLM's CacheConfig.metrics_info() keys that mean something here (a subset; values as strings, in this
    order: the order is the label order of the series)."""
    return {
        "block_size": str(BLOCK_SIZE),
        "cache_dtype": "auto",
        "calculate_kv_scales": "False",
        "cpu_offload_gb": "0",
        "enable_prefix_caching": str(k.enable_prefix_caching),
        "gpu_memory_utilization": str(k.gpu_memory_utilization),
        "is_attention_free": "False",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(k.num_gpu_blocks),
        "num_gpu_blocks_override": str(override),
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "swap_space": "4",
    }
