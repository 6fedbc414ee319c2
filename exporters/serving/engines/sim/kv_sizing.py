"""KV-cache sizing from the knobs, against the model and the GPU, and the ``vllm:cache_config_info`` labels
that describe the result."""

from __future__ import annotations

from exporters.serving.engine import EngineError, ErrorKind
from exporters.serving.engines.sim import roofline
from exporters.serving.engines.sim.knobs import Knobs
from exporters.serving.engines.sim.profile import GPUProfile
from exporters.serving.engines.sim.roofline import BLOCK_SIZE
from exporters.serving.engines.sim.sched_types import cdiv
from loadlens.contracts.model_profile import ModelProfile
from loadlens.contracts.profile_schema import ProfileError


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
    """vLLM 0.32's ``vllm:cache_config_info`` labels (every field of its ``CacheConfig``, as ``str()`` writes
    them) for the sim's cache, in alphabetical order (the order of the series' labels, ``engine`` then added
    last). The sizes are the sim's own: 16-token blocks, ``num_gpu_blocks`` of them, and vLLM's capacity
    arithmetic for one full-attention group (concurrency = blocks / blocks of one ``max_model_len`` request;
    tokens = concurrency x ``max_model_len``). Fields the sim has no notion of (Mamba state, KV offloading, the
    layout and hash granularity that vLLM's API server never learns from its engine core) carry what vLLM
    0.32's API server prints for a default Llama-style server on a GPU."""
    concurrency = k.num_gpu_blocks / cdiv(k.max_model_len, BLOCK_SIZE) if k.num_gpu_blocks else 0.0
    return {
        "_block_size_resolved": "True",
        "block_size": str(BLOCK_SIZE),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(BLOCK_SIZE),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(k.enable_prefix_caching),
        "gpu_memory_utilization": str(k.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(concurrency),
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(int(concurrency * k.max_model_len)),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(k.num_gpu_blocks),
        "num_gpu_blocks_override": str(override),
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }
