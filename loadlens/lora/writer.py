"""Writing a PEFT LoRA adapter without torch: ``adapter_config.json`` and ``adapter_model.safetensors``
(docs/lora.md).

The safetensors file is written directly: an 8-byte little-endian header length, the header JSON (each
tensor's dtype, shape and byte range in the data; padded with spaces to a multiple of 8) and the tensors'
raw little-endian bytes, one after another. Tensors are generated and written one at a time, so a large
model's adapter never sits in memory whole.

Initialisation follows PEFT's default for A (uniform in ±1/sqrt(d_in), as ``kaiming_uniform_(a=sqrt(5))``
gives); B is zero (PEFT's default: the adapter changes nothing) or, by default, normal with standard
deviation ``B_STD`` so that each adapter changes the output. Both come from a seeded generator, so the same
arguments write the same bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadlens.lora.shapes import BaseShape

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
B_STD = 0.05
SAFETENSORS_DTYPE = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}
PREFIX = "base_model.model.model.layers"
"""PEFT's name for a causal LM's decoder layers in a saved adapter."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, int]
    bound: float
    """A: the uniform bound; B: 0.0 (the init decides)."""


@dataclass(frozen=True)
class Written:
    directory: Path
    file_bytes: int
    """``adapter_model.safetensors``'s size on disk."""
    header_bytes: int
    """Its 8-byte length field plus the header JSON."""
    tensor_bytes: int
    tensors: int


def tensor_specs(shape: BaseShape, rank: int, target_modules: Sequence[str]) -> list[TensorSpec]:
    """Every tensor of the adapter, in file order: per layer, per module, ``lora_A`` (r x d_in) then
    ``lora_B`` (d_out x r), as PEFT names them."""
    specs = []
    for layer in range(shape.layers):
        for name in target_modules:
            m = shape.module(name)
            stem = f"{PREFIX}.{layer}.{m.parent}.{m.name}"
            specs.append(TensorSpec(f"{stem}.lora_A.weight", (rank, m.d_in), 1.0 / float(np.sqrt(m.d_in))))
            specs.append(TensorSpec(f"{stem}.lora_B.weight", (m.d_out, rank), 0.0))
    return specs


def adapter_config(rank: int, alpha: float, target_modules: Sequence[str], base_name: str) -> dict[str, Any]:
    """The fields PEFT's ``LoraConfig`` and vLLM read; the rest take PEFT's defaults."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": rank,
        "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,
        "target_modules": list(target_modules),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }


def _encode(values: np.ndarray, dtype: str) -> bytes:
    """float32 values as little-endian bytes of ``dtype`` (bf16: rounded to nearest even)."""
    if dtype == "fp32":
        return values.astype("<f4").tobytes()
    if dtype == "fp16":
        return values.astype("<f2").tobytes()
    bits = values.astype("<f4").view("<u4")
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype("<u2").tobytes()


def _values(spec: TensorSpec, rng: np.random.Generator, random_b: bool) -> np.ndarray:
    if spec.name.endswith("lora_A.weight"):
        return rng.uniform(-spec.bound, spec.bound, size=spec.shape).astype(np.float32)
    if random_b:
        return (rng.standard_normal(size=spec.shape) * B_STD).astype(np.float32)
    return np.zeros(spec.shape, dtype=np.float32)


def header(specs: Sequence[TensorSpec], dtype: str) -> bytes:
    """The length field and the padded header JSON for ``specs`` stored back to back in that order."""
    width = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
    doc: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for s in specs:
        size = s.shape[0] * s.shape[1] * width
        doc[s.name] = {
            "dtype": SAFETENSORS_DTYPE[dtype],
            "shape": list(s.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(doc, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _chunks(specs: Sequence[TensorSpec], dtype: str, seed: int, random_b: bool) -> Iterator[bytes]:
    rng = np.random.default_rng(seed)
    for spec in specs:
        yield _encode(_values(spec, rng, random_b), dtype)


def write_adapter(
    out: Path,
    shape: BaseShape,
    *,
    rank: int,
    alpha: float,
    target_modules: Sequence[str],
    dtype: str,
    seed: int,
    random_b: bool,
    base_name: str,
) -> Written:
    """Write the adapter's two files into ``out`` (which must exist). Raises ``OSError`` if it cannot."""
    specs = tensor_specs(shape, rank, target_modules)
    head = header(specs, dtype)
    weights = out / WEIGHTS_FILE
    tensor_bytes = 0
    with weights.open("wb") as f:
        f.write(head)
        for chunk in _chunks(specs, dtype, seed, random_b):
            f.write(chunk)
            tensor_bytes += len(chunk)
    config = adapter_config(rank, alpha, target_modules, base_name)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return Written(out, weights.stat().st_size, len(head), tensor_bytes, len(specs))
