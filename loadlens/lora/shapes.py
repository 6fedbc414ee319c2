"""A base model's LoRA-targetable linear modules and their shapes, from a Hugging Face ``config.json``, a
model directory holding one, or a model profile (packaged name or YAML; the sim's own) (docs/lora.md).

Llama-style decoders only (Llama, Qwen2/3, Mistral, DeepSeek's Llama-shaped models): the attention projections
``q_proj``/``k_proj``/``v_proj``/``o_proj`` under ``self_attn`` and the MLP's ``gate_proj``/``up_proj``/
``down_proj`` under ``mlp``. A mixture-of-experts config has no dense MLP, so it offers the attention modules
only; multi-head latent attention (DeepSeek-V2/V3) is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadlens.contracts import model_config
from loadlens.contracts.model_config import ModelConfig, ModelConfigError
from loadlens.contracts.model_profile import LINEAR_MODULES, load_model_profile
from loadlens.contracts.profile_schema import ProfileError

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


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


def _base(config: ModelConfig) -> BaseShape:
    return _dims(config.name, config.layers, config.hidden, config.q_dim, config.kv_dim, config.intermediate)


def _read(read: Callable[[], ModelConfig]) -> BaseShape:
    try:
        return _base(read())
    except ModelConfigError as err:
        raise ShapeError(str(err)) from None


def from_hf_config(doc: Any, source: str) -> BaseShape:
    """The shape of a Hugging Face ``config.json`` (its ``text_config`` or ``language_config`` when nested)."""
    return _read(lambda: model_config.from_hf_config(doc, source))


def from_config_file(path: Path) -> BaseShape:
    return _read(lambda: model_config.from_config_file(path))


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
    """``base`` as a ``config.json`` file, a directory holding one, or else a sim model profile name (read by
    ``loadlens/contracts/model_config.py``, the MFU estimate's reader too)."""
    path = Path(base)
    if path.is_dir() or (path.is_file() and path.suffix == ".json"):
        return _read(lambda: model_config.resolve(base))
    return from_profile(base)
