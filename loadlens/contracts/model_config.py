"""A served model's shape from a Hugging Face ``config.json``, a model directory holding one, or a model profile
(packaged name or YAML, ``model_profile.py``): the one reader behind ``loadlens lora make`` (its module shapes,
``loadlens/lora/shapes.py``) and the MFU estimate (``mfu.py``: ``loadlens serve --model-config``).

Llama-style decoders (Llama, Qwen2/3, Mistral, DeepSeek's Llama-shaped models). A nested ``text_config`` or
``language_config`` is read instead of the top level. Multi-head latent attention (``kv_lora_rank``) is refused;
a mixture-of-experts config reads with ``intermediate = None`` (its MLP is not one dense block) and its
experts' key in ``moe_key``, for the callers that cannot use it to name. Errors are one line naming the file
and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadlens.contracts.model_profile import ModelProfile, load_model_profile
from loadlens.contracts.profile_schema import ProfileError

# Keys that mark a mixture-of-experts config (Mixtral, Qwen2-MoE, DeepSeek-MoE): its MLP is not one dense block.
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# Bytes per weight by quantization_config.quant_method (the common methods; 16-bit without one).
QUANT_WEIGHT_BYTES: dict[str, float] = {
    "awq": 0.5,
    "awq_marlin": 0.5,
    "gptq": 0.5,
    "gptq_marlin": 0.5,
    "compressed-tensors": 0.5,
    "fp8": 1.0,
}
DTYPE_BYTES = 2
"""Activations, the KV cache and unquantised weights: 16-bit (vLLM's ``--dtype auto`` serves an fp32
checkpoint in fp16/bf16 too)."""


class ModelConfigError(ValueError):
    """The model's shape cannot be read; the message is one line naming the file and the field."""


@dataclass(frozen=True)
class ModelConfig:
    name: str
    """What the model was given as (a path or a profile name)."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int | None
    """The dense MLP's width; None for a mixture-of-experts model."""
    vocab: int | None
    """None when the config does not say (``loadlens lora make`` does not need it)."""
    weight_bytes: float | None = DTYPE_BYTES
    """Bytes per decoder weight (0.5 for 4-bit quantisation); None for a ``quantization_config.quant_method``
    not in ``QUANT_WEIGHT_BYTES``."""
    moe_key: str | None = None
    """The config key that marked the model as a mixture of experts."""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def _positive(doc: dict[str, Any], key: str, source: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"{source}: field {key!r} must be a positive integer, got {value!r}")
    return value


def _weight_bytes(doc: dict[str, Any]) -> float | None:
    quant = doc.get("quantization_config")
    if quant is None:
        return DTYPE_BYTES
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return QUANT_WEIGHT_BYTES.get(method) if isinstance(method, str) else None


def from_hf_config(doc: Any, source: str) -> ModelConfig:
    """The shape of a Hugging Face ``config.json`` document (its ``text_config`` or ``language_config`` when
    nested)."""
    if not isinstance(doc, dict):
        raise ModelConfigError(f"{source}: config.json must hold a JSON object")
    top = doc
    for nested in ("text_config", "language_config"):
        if isinstance(doc.get(nested), dict):
            doc = doc[nested]
            break
    if doc.get("kv_lora_rank") is not None:
        raise ModelConfigError(f"{source}: multi-head latent attention (kv_lora_rank, DeepSeek-V2/V3) is not supported")
    layers = _positive(doc, "num_hidden_layers", source)
    hidden = _positive(doc, "hidden_size", source)
    heads = _positive(doc, "num_attention_heads", source)
    kv_heads = _positive(doc, "num_key_value_heads", source) if doc.get("num_key_value_heads") is not None else heads
    if doc.get("head_dim") is not None:
        head_dim = _positive(doc, "head_dim", source)
    elif hidden % heads:
        raise ModelConfigError(f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    else:
        head_dim = hidden // heads
    moe_key = next((k for k in MOE_KEYS if doc.get(k)), None)
    intermediate = None if moe_key else _positive(doc, "intermediate_size", source)
    vocab = _positive(doc, "vocab_size", source) if doc.get("vocab_size") is not None else None
    weight = _weight_bytes(doc if "quantization_config" in doc else top)
    return ModelConfig(source, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, weight, moe_key)


def from_config_file(path: Path) -> ModelConfig:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelConfigError(f"{path}: cannot read config.json: {err}") from err
    return from_hf_config(doc, str(path))


def from_model_profile(profile: ModelProfile, name: str | None = None) -> ModelConfig:
    """A loaded model profile's shape (the sim's own)."""
    weight = QUANT_WEIGHT_BYTES["awq"] if profile.dtype == "awq-4bit" else DTYPE_BYTES
    return ModelConfig(name or profile.name, profile.layers, profile.hidden, profile.heads, profile.kv_heads,
                       profile.head_dim, profile.intermediate, profile.vocab, weight)  # fmt: skip


def resolve(base: str) -> ModelConfig:
    """``base`` as a ``config.json`` file, a directory holding one, or else a model profile name or YAML path."""
    path = Path(base)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelConfigError(f"{path}: no config.json in this directory")
        return from_config_file(path / "config.json")
    if path.suffix == ".json":
        return from_config_file(path)  # a missing file: "cannot read config.json: No such file ..."
    try:
        return from_model_profile(load_model_profile(base))
    except ProfileError as err:
        raise ModelConfigError(str(err)) from None
