"""``make_adapter``: the library entry point behind ``loadlens lora make`` (docs/lora.md, *From Python*).

    report = make_adapter("tiny", Path("adapters/r8"), rank=8, target_modules=["q_proj", "v_proj"])
    report.file_bytes, report.formula_bytes, report.modules[0].bytes

Every check runs before anything is written; bad input raises :class:`LoraError` with one line (the CLI exits
2 with it). numpy (the ``lora`` extra) is imported only when the adapter is written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadlens.lora import shapes, sizes
from loadlens.lora.shapes import LoraError

DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "v_proj")
ALL_LINEAR = "all-linear"
INIT_B: tuple[str, ...] = ("random", "zero")
DTYPES: tuple[str, ...] = tuple(sizes.DTYPE_BYTES)


@dataclass(frozen=True)
class AdapterReport:
    """What ``make_adapter`` wrote and its size by the guide's formula; ``as_json()`` is ``--json``'s document
    (docs/lora.md lists every key)."""

    base: str
    """BASE as given."""
    out: Path
    rank: int
    alpha: float
    dtype: str
    init_b: str
    seed: int
    target_modules: tuple[str, ...]
    """The modules adapted, in the layer's order."""
    modules: tuple[sizes.ModuleSize, ...]
    """Per target module: d_in, d_out, layers, parameters and bytes by the formula."""
    formula_params: int
    formula_bytes: int
    file_bytes: int
    """``adapter_model.safetensors``'s size on disk."""
    header_bytes: int
    tensor_bytes: int
    tensors: int

    def as_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "out": str(self.out),
            "rank": self.rank,
            "alpha": self.alpha,
            "dtype": self.dtype,
            "init_b": self.init_b,
            "seed": self.seed,
            "target_modules": list(self.target_modules),
            "modules": [
                {
                    "module": m.module,
                    "d_in": m.d_in,
                    "d_out": m.d_out,
                    "layers": m.layers,
                    "params_per_layer": m.params_per_layer,
                    "params": m.params,
                    "bytes": m.bytes,
                }
                for m in self.modules
            ],  # fmt: skip
            "formula_params": self.formula_params,
            "formula_bytes": self.formula_bytes,
            "file_bytes": self.file_bytes,
            "header_bytes": self.header_bytes,
            "tensor_bytes": self.tensor_bytes,
            "tensors": self.tensors,
        }


def target_list(target_modules: str | Sequence[str], available: Sequence[str]) -> list[str]:
    """The modules to adapt, in the layer's order: a list of names, a comma-separated string, or ``all-linear``
    (every module the base has)."""
    wanted = target_modules.split(",") if isinstance(target_modules, str) else list(target_modules)
    if not all(isinstance(t, str) for t in wanted):
        raise LoraError(f"target modules must be names, got {target_modules!r}")
    wanted = [t.strip() for t in wanted if t.strip()]
    if wanted == [ALL_LINEAR]:
        return list(available)
    if not wanted:
        raise LoraError("target modules: give at least one module")
    if len(set(wanted)) != len(wanted):
        raise LoraError(f"target modules: a module is named twice: {target_modules!r}")
    return [m for m in available if m in wanted] + [m for m in wanted if m not in available]


def _whole(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LoraError(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        raise LoraError(f"{what} must be at least {minimum}, got {value}")
    return value


def _alpha(alpha: float | None, rank: int) -> float:
    if alpha is None:
        return 2.0 * rank
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha) or alpha <= 0:
        raise LoraError(f"alpha must be a finite number > 0, got {alpha!r}")
    return float(alpha)


def _choice(value: str, what: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise LoraError(f"{what} must be one of {', '.join(choices)}, got {value!r}")
    return value


def prepare_out(out: Path, force: bool) -> None:
    """Create ``out`` (with its parents); refuse a file, a non-empty directory without ``force``, or one that
    cannot be written."""
    if out.exists() and not out.is_dir():
        raise LoraError(f"out directory {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise LoraError(f"out directory {out}: directory is not empty (--force, or force=True, writes into it)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise LoraError(f"out directory {out}: cannot create: {err.strerror or err}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise LoraError(f"out directory {out}: directory is not writable")


def make_adapter(
    base: str | Path,
    out_dir: Path,
    *,
    rank: int,
    alpha: float | None = None,
    target_modules: str | Sequence[str] = DEFAULT_TARGETS,
    dtype: str = "bf16",
    init_b: str = "random",
    seed: int = 0,
    base_name: str | None = None,
    force: bool = False,
) -> AdapterReport:
    """Write a PEFT LoRA adapter for ``base`` (a ``config.json``, a model directory or a model profile name or
    YAML file) into ``out_dir`` and report it. ``alpha`` defaults to 2 x rank; ``init_b`` is ``random`` (the
    adapter changes the output) or ``zero`` (PEFT's initialisation: it changes nothing); ``base_name`` is
    ``adapter_config.json``'s ``base_model_name_or_path`` (default: ``base``). Raises :class:`LoraError` on bad
    input, before writing anything, and when the files cannot be written."""
    base_text = str(base)
    rank = _whole(rank, "rank", 1)
    seed = _whole(seed, "seed", 0)
    dtype = _choice(dtype, "dtype", DTYPES)
    init_b = _choice(init_b, "init_b", INIT_B)
    lora_alpha = _alpha(alpha, rank)
    shape = shapes.resolve(base_text)
    targets = target_list(target_modules, [m.name for m in shape.modules])
    size = sizes.adapter_size(shape, rank, targets, dtype)
    try:
        from loadlens.lora import writer
    except ImportError as err:
        raise LoraError(f"needs the 'lora' extra ({err.name} is not installed): pip install 'loadlens[lora]'") from err
    out = Path(out_dir)
    prepare_out(out, force)
    try:
        written = writer.write_adapter(
            out, shape, rank=rank, alpha=lora_alpha, target_modules=targets, dtype=dtype, seed=seed,
            random_b=init_b == "random", base_name=base_name if base_name is not None else base_text,
        )  # fmt: skip
    except OSError as err:
        raise LoraError(f"out directory {out}: cannot write: {err.strerror or err}") from None
    return AdapterReport(
        base=base_text, out=written.directory, rank=rank, alpha=lora_alpha, dtype=dtype, init_b=init_b, seed=seed,
        target_modules=tuple(targets), modules=size.modules, formula_params=size.params, formula_bytes=size.bytes,
        file_bytes=written.file_bytes, header_bytes=written.header_bytes, tensor_bytes=written.tensor_bytes,
        tensors=written.tensors,
    )  # fmt: skip
