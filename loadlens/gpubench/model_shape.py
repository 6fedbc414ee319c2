"""The shapes gpu-bench measures at, from a packaged model profile (or a profile YAML), a Hugging Face
``config.json`` or a model directory holding one. Model shapes have one home, the model profiles
(``loadlens/contracts/model_profile.py``); a ``config.json`` is read by ``loadlens.lora.shapes`` (the same
checks and refusals as ``loadlens lora make``), plus its head count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadlens.contracts.gpu_bench_result import ModelShape
from loadlens.contracts.model_profile import load_model_profile
from loadlens.contracts.profile_schema import ProfileError
from loadlens.lora.shapes import BaseShape, ShapeError, resolve


class ModelShapeError(ValueError):
    """The model cannot be read; one line."""


def _config_path(value: str) -> Path | None:
    path = Path(value)
    if path.is_dir():
        return path / "config.json"
    if path.is_file() and path.suffix == ".json":
        return path
    return None


def _heads(config: Path) -> int:
    doc: Any = json.loads(config.read_text(encoding="utf-8"))
    for nested in ("text_config", "language_config"):
        if isinstance(doc.get(nested), dict):
            doc = doc[nested]
            break
    return int(doc["num_attention_heads"])  # checked positive by lora.shapes already


def model_shape(value: str) -> ModelShape:
    """``value`` as a model directory, a ``config.json`` or a model profile name/path."""
    config = _config_path(value)
    if config is None:
        try:
            p = load_model_profile(value)
        except ProfileError as err:
            raise ModelShapeError(str(err)) from None
        return ModelShape(name=value, layers=p.layers, hidden=p.hidden, heads=p.heads, kv_heads=p.kv_heads,
                          head_dim=p.head_dim, intermediate=p.intermediate)  # fmt: skip
    try:
        base: BaseShape = resolve(value)
    except ShapeError as err:
        raise ModelShapeError(str(err)) from None
    heads = _heads(config)
    q, k = base.module("q_proj"), base.module("k_proj")
    head_dim = q.d_out // heads
    mlp = [m for m in base.modules if m.name == "gate_proj"]
    return ModelShape(name=value, layers=base.layers, hidden=q.d_in, heads=heads, kv_heads=k.d_out // head_dim,
                      head_dim=head_dim, intermediate=mlp[0].d_out if mlp else None)  # fmt: skip
