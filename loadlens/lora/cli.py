"""``loadlens lora make``: write a PEFT LoRA adapter of any rank for a base model, offline, and report its size
by the guide's formula beside the file's real size (docs/lora.md)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from loadlens.util.cliutil import UsageError

DEFAULT_TARGETS = "q_proj,v_proj"
MIB = 1024 * 1024


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("lora", help="LoRA adapters: make one of any rank offline", description=__doc__)
    lora_sub = p.add_subparsers(dest="lora_command", metavar="ACTION", required=True)
    make = lora_sub.add_parser(
        "make",
        help="write a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) and report its size",
        description="Write a PEFT LoRA adapter for BASE and print its size per module and in total (docs/lora.md).",
    )
    make.add_argument(
        "base", metavar="BASE", help="a Hugging Face config.json, a model directory holding one, or a sim model profile"
    )
    make.add_argument("--out", type=Path, required=True, help="the adapter's directory (created if missing)")
    make.add_argument("--rank", "-r", type=int, default=8, help="LoRA rank r, at least 1 (default: 8)")
    make.add_argument("--alpha", type=float, help="lora_alpha (default: 2 x rank)")
    make.add_argument(
        "--target-modules", default=DEFAULT_TARGETS, help=f"comma-separated, or all-linear (default: {DEFAULT_TARGETS})"
    )
    make.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="tensor dtype (default: bf16)")
    make.add_argument("--seed", type=int, default=0, help="seed of the random A and B (default: 0)")
    make.add_argument(
        "--init-b", choices=("random", "zero"), default="random",
        help="B random (the adapter changes the output) or zero (PEFT's default: it changes nothing) (default: random)",
    )  # fmt: skip
    make.add_argument("--base-name", help="adapter_config.json's base_model_name_or_path (default: BASE as given)")
    make.add_argument("--force", action="store_true", help="write into a non-empty --out (our two files are replaced)")
    make.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    make.set_defaults(handler=run_make)


def _targets(text: str, available: list[str]) -> list[str]:
    if text.strip() == "all-linear":
        return available
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    if not wanted:
        raise UsageError("--target-modules: give at least one module")
    if len(set(wanted)) != len(wanted):
        raise UsageError(f"--target-modules: a module is named twice: {text!r}")
    return [m for m in available if m in wanted] + [m for m in wanted if m not in available]


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"--out {out}: directory is not empty (use --force to write into it)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {out}: cannot create: {err.strerror or err}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: directory is not writable")


def report(args: argparse.Namespace, size: Any, written: Any, targets: list[str], alpha: float) -> dict[str, Any]:
    """The ``--json`` document (docs/lora.md lists every key)."""
    return {
        "base": args.base,
        "out": str(written.directory),
        "rank": args.rank,
        "alpha": alpha,
        "dtype": args.dtype,
        "init_b": args.init_b,
        "seed": args.seed,
        "target_modules": targets,
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
            for m in size.modules
        ],  # fmt: skip
        "formula_params": size.params,
        "formula_bytes": size.bytes,
        "file_bytes": written.file_bytes,
        "header_bytes": written.header_bytes,
        "tensor_bytes": written.tensor_bytes,
        "tensors": written.tensors,
    }


def table(doc: dict[str, Any]) -> str:
    head = ("module", "d_in", "d_out", "layers", "params/layer", "params", "MiB")
    rows = [
        (m["module"], m["d_in"], m["d_out"], m["layers"], m["params_per_layer"], m["params"], f"{m['bytes'] / MIB:.3f}")
        for m in doc["modules"]
    ]
    rows.append(("total", "", "", "", "", doc["formula_params"], f"{doc['formula_bytes'] / MIB:.3f}"))
    cells = [head, *[tuple(str(c) for c in r) for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = [f"adapter {doc['out']}: rank {doc['rank']}, alpha {doc['alpha']:g}, {doc['dtype']}, B {doc['init_b']}"]
    lines += [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in cells
    ]
    lines.append(
        f"file adapter_model.safetensors: {doc['file_bytes']} bytes ({doc['file_bytes'] / MIB:.3f} MiB) = "
        f"{doc['tensor_bytes']} tensor bytes ({doc['tensors']} tensors) + {doc['header_bytes']} header bytes; "
        f"formula {doc['formula_bytes']} bytes"
    )
    return "\n".join(lines)


def run_make(args: argparse.Namespace) -> int:
    from loadlens.lora import shapes, sizes

    if args.rank < 1:
        raise UsageError(f"--rank must be at least 1, got {args.rank}")
    try:
        shape = shapes.resolve(args.base)
        targets = _targets(args.target_modules, [m.name for m in shape.modules])
        size = sizes.adapter_size(shape, args.rank, targets, args.dtype)
    except shapes.ShapeError as err:
        raise UsageError(str(err)) from None
    alpha = float(args.alpha) if args.alpha is not None else 2.0 * args.rank
    _prepare_out(args.out, args.force)
    from loadlens.lora import writer

    try:
        written = writer.write_adapter(
            args.out, shape, rank=args.rank, alpha=alpha, target_modules=targets, dtype=args.dtype,
            seed=args.seed, random_b=args.init_b == "random", base_name=args.base_name or args.base,
        )  # fmt: skip
    except OSError as err:
        raise UsageError(f"--out {args.out}: cannot write: {err.strerror or err}") from None
    doc = report(args, size, written, targets, alpha)
    print(json.dumps(doc, indent=2) if args.json else table(doc))
    return 0
