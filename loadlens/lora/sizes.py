"""An adapter's size by the guide's formula (seed guide 2.1): a rank-r update of a d_in x d_out weight is
A (r x d_in) and B (d_out x r), r·(d_in + d_out) parameters (2·d·r for a square d x d one), per layer and
target module; bytes are parameters times the dtype's width (docs/lora.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadlens.lora.shapes import BaseShape

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ModuleSize:
    module: str
    d_in: int
    d_out: int
    layers: int
    params_per_layer: int
    """r·(d_in + d_out)."""
    params: int
    """``params_per_layer`` in every layer."""
    bytes: int


@dataclass(frozen=True)
class AdapterSize:
    rank: int
    dtype: str
    modules: tuple[ModuleSize, ...]

    @property
    def params(self) -> int:
        return sum(m.params for m in self.modules)

    @property
    def bytes(self) -> int:
        return sum(m.bytes for m in self.modules)


def lora_params(rank: int, d_in: int, d_out: int) -> int:
    """Parameters of one rank-``rank`` LoRA update of a ``d_in`` x ``d_out`` weight."""
    return rank * (d_in + d_out)


def adapter_size(shape: BaseShape, rank: int, target_modules: Sequence[str], dtype: str) -> AdapterSize:
    width = DTYPE_BYTES[dtype]
    rows = []
    for name in target_modules:
        m = shape.module(name)
        per_layer = lora_params(rank, m.d_in, m.d_out)
        params = per_layer * shape.layers
        rows.append(ModuleSize(name, m.d_in, m.d_out, shape.layers, per_layer, params, params * width))
    return AdapterSize(rank, dtype, tuple(rows))
