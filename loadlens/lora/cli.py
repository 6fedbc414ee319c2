"""``loadlens lora make``: write a PEFT LoRA adapter of any rank for a base model, offline, and report its size
by the guide's formula beside the file's real size (docs/lora.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from loadlens.lora.make import DEFAULT_TARGETS, DTYPES, INIT_B
from loadlens.util.cliutil import UsageError

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
        "--target-modules",
        default=",".join(DEFAULT_TARGETS),
        help=f"comma-separated, or all-linear (default: {','.join(DEFAULT_TARGETS)})",
    )
    make.add_argument("--dtype", choices=DTYPES, default="bf16", help="tensor dtype (default: bf16)")
    make.add_argument("--seed", type=int, default=0, help="seed of the random A and B (default: 0)")
    make.add_argument(
        "--init-b", choices=INIT_B, default="random",
        help="B random (the adapter changes the output) or zero (PEFT's default: it changes nothing) (default: random)",
    )  # fmt: skip
    make.add_argument("--base-name", help="adapter_config.json's base_model_name_or_path (default: BASE as given)")
    make.add_argument("--force", action="store_true", help="write into a non-empty --out (our two files are replaced)")
    make.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    make.set_defaults(handler=run_make)


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
    from loadlens.lora.make import make_adapter
    from loadlens.lora.shapes import LoraError

    try:
        made = make_adapter(
            args.base, args.out, rank=args.rank, alpha=args.alpha, target_modules=args.target_modules,
            dtype=args.dtype, init_b=args.init_b, seed=args.seed, base_name=args.base_name, force=args.force,
        )  # fmt: skip
    except LoraError as err:
        raise UsageError(str(err)) from None
    doc = made.as_json()
    print(json.dumps(doc, indent=2) if args.json else table(doc))
    return 0
