"""A base model's LoRA-targetable linear modules and their shapes, from a Hugging Face ``config.json``, a
model directory holding one, or a model profile (packaged name or YAML; the sim's own) (docs/lora.md).

Llama-style decoders only (Llama, Qwen2/3, Mistral, DeepSeek's Llama-shaped models): the attention projections
``q_proj``/``k_proj``/``v_proj``/``o_proj`` under ``self_attn`` and the MLP's ``gate_proj``/``up_proj``/
``down_proj`` under ``mlp``. A mixture-of-experts config has no dense MLP, so it offers the attention modules
only; multi-head latent attention (DeepSeek-V2/V3) is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadlens.contracts.model_profile import LINEAR_MODULES, load_model_profile
from loadlens.contracts.profile_schema import ProfileError

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# Keys that mark a mixture-of-experts config (Mixtral, Qwen2-MoE, DeepSeek-MoE): its MLP is not one dense block.
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


class LoraError(ValueError):
    """Bad input to ``make_adapter`` or ``loadlens lora make`` (the CLI exits 2 with it); the message is one
    line."""


class ShapeError(LoraError):
    """The base model cannot be read or sized; the message is one line."""


@dataclass(frozen=True)
class ModuleShape:
    name: str
    parent: str
    """``self_attn`` or ``mlp``: the module's place in a layer, for PEFT's tensor names."""
    d_in: int
    d_out: int


@dataclass(frozen=True)
class BaseShape:
    name: str
    """What the base was given as (a path or a profile name)."""
    layers: int
    modules: tuple[ModuleShape, ...]
    """Every targetable module, in the layer's order."""

    def module(self, name: str) -> ModuleShape:
        for m in self.modules:
            if m.name == name:
                return m
        raise ShapeError(f"target module {name!r} is not a linear layer of {self.name} "
                         f"(known: {', '.join(m.name for m in self.modules)})")  # fmt: skip


def _dims(name: str, layers: int, hidden: int, q_dim: int, kv_dim: int, intermediate: int | None) -> BaseShape:
    modules = [
        ModuleShape("q_proj", "self_attn", hidden, q_dim),
        ModuleShape("k_proj", "self_attn", hidden, kv_dim),
        ModuleShape("v_proj", "self_attn", hidden, kv_dim),
        ModuleShape("o_proj", "self_attn", q_dim, hidden),
    ]
    if intermediate is not None:
        modules += [
            ModuleShape("gate_proj", "mlp", hidden, intermediate),
            ModuleShape("up_proj", "mlp", hidden, intermediate),
            ModuleShape("down_proj", "mlp", intermediate, hidden),
        ]
    return BaseShape(name, layers, tuple(modules))


def _positive(doc: dict[str, Any], key: str, source: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ShapeError(f"{source}: field {key!r} must be a positive integer, got {value!r}")
    return value


def from_hf_config(doc: Any, source: str) -> BaseShape:
    """The shape of a Hugging Face ``config.json`` (its ``text_config`` or ``language_config`` when nested)."""
    if not isinstance(doc, dict):
        raise ShapeError(f"{source}: config.json must hold a JSON object")
    for nested in ("text_config", "language_config"):
        if isinstance(doc.get(nested), dict):
            doc = doc[nested]
            break
    if doc.get("kv_lora_rank") is not None:
        raise ShapeError(f"{source}: multi-head latent attention (kv_lora_rank, DeepSeek-V2/V3) is not supported")
    layers = _positive(doc, "num_hidden_layers", source)
    hidden = _positive(doc, "hidden_size", source)
    heads = _positive(doc, "num_attention_heads", source)
    kv_heads = _positive(doc, "num_key_value_heads", source) if doc.get("num_key_value_heads") is not None else heads
    if doc.get("head_dim") is not None:
        head_dim = _positive(doc, "head_dim", source)
    elif hidden % heads:
        raise ShapeError(f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    else:
        head_dim = hidden // heads
    moe = any(doc.get(k) for k in _MOE_KEYS)
    intermediate = None if moe else _positive(doc, "intermediate_size", source)
    return _dims(source, layers, hidden, heads * head_dim, kv_heads * head_dim, intermediate)


def from_config_file(path: Path) -> BaseShape:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ShapeError(f"{path}: cannot read config.json: {err}") from err
    return from_hf_config(doc, str(path))


def from_profile(name: str) -> BaseShape:
    """A packaged model profile (or a profile YAML file): the shapes the sim's LoRA cost model uses too
    (``loadlens/contracts/model_profile.py``)."""
    try:
        profile = load_model_profile(name)
    except ProfileError as err:
        raise ShapeError(str(err)) from None
    modules = tuple(
        ModuleShape(m, "self_attn" if m in ATTENTION else "mlp", *profile.module_dims(m)) for m in LINEAR_MODULES
    )
    return BaseShape(profile.name, profile.layers, modules)


def resolve(base: str) -> BaseShape:
    """``base`` as a ``config.json`` file, a directory holding one, or else a sim model profile name."""
    path = Path(base)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ShapeError(f"{path}: no config.json in this directory")
        return from_config_file(path / "config.json")
    if path.is_file() and path.suffix == ".json":
        return from_config_file(path)
    return from_profile(base)
