"""LoRA on the device: guide 2.1's rank-vs-latency timing and guide 2.2's multi-adapter allocator figures.

The same script on a GPU host (``make gpu-check``, third step) and on a CPU (CI, ``tests/benchmarks``)::

    python -m benchmarks.gpu_lora_check --out results/gpu-check/lora            # CUDA when present, else CPU
    python -m benchmarks.gpu_lora_check --out DIR --size tiny --device cpu      # seconds: the CI test

1. Adapter path: a zero-B adapter leaves the logits equal to the base model's, a random one changes them.
2. ``lora-rank`` timing (``lora_decode_timing``): greedy decode at each batch size, base vs unmerged PEFT
   LoRA at each rank on q_proj/v_proj, per-token mean/median ms, increment over base, power-law fit.
3. Allocator figures (``lora_alloc_figures``, CUDA only): 1, 2, 3 adapters (r8, q/v, alpha 16) as the
   in-process probe's document shows them. On a CPU: ``{"skipped": reason}``.

Writes ``lora.json`` and ``lora.md`` under ``--out`` (docs/probe-documents.md, "LoRA check", lists every
key). Exit 0 when every check passes, 1 when one fails, 2 (one line) on bad arguments or without torch/PEFT.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import lora_decode_timing as ldt
from benchmarks.gpu_probe_rig import versions

SIZES = {"tiny": ldt.TINY_SHAPE, "cpu": ldt.CPU_SHAPE, "gpu": ldt.CUDA_SHAPE}


def device_info(torch: Any, device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"kind": device, "cpu_count": os.cpu_count(), "machine": platform.machine()}
    info["torch_cuda"] = getattr(torch.version, "cuda", None)
    if device == "cuda":
        info["name"] = torch.cuda.get_device_name(0)
        try:
            import pynvml

            pynvml.nvmlInit()
            driver = pynvml.nvmlSystemGetDriverVersion()
            info["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        except Exception as err:  # no nvidia-ml-py: the driver stays unknown, said so
            info["driver"] = None
            info["driver_error"] = f"{type(err).__name__}: {err}"
    else:
        info["name"] = platform.processor() or platform.machine()
    return info


def adapter_path_check(shape: ldt.DecodeShape, torch: Any, device: str, dtype: Any) -> dict[str, Any]:
    """Logits of one prompt: base, zero-B adapter (must be equal), random-B adapter (must differ)."""
    model = ldt.build_model(shape, torch, device, dtype)
    prompt = torch.randint(0, shape.vocab, (1, 8), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.inference_mode():
        base = model(input_ids=prompt).logits.float().cpu()
    out: dict[str, Any] = {}
    for label, zero in (("zero_b", True), ("random_b", False)):
        m = ldt.attach_lora(model, 8, torch, seed=7, zero_b=zero)
        with torch.inference_mode():
            logits = m(input_ids=prompt).logits.float().cpu()
        out[f"{label}_max_abs_diff"] = float((logits - base).abs().max())
        model = m.unload()
    out["zero_b_equal"] = out["zero_b_max_abs_diff"] == 0.0
    out["random_b_differs"] = out["random_b_max_abs_diff"] > 0.0
    return out


def run(args: argparse.Namespace, torch: Any) -> dict[str, Any]:
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = SIZES[args.size or ("gpu" if device == "cuda" else "cpu")]
    label = ldt.dtype_name(torch, dtype)
    torch.set_num_threads(args.threads) if args.threads else None
    result: dict[str, Any] = {
        "tool": "gpu_lora_check",
        "device": device_info(torch, device),
        "packages": versions(),
        "model": {"size": args.size or ("gpu" if device == "cuda" else "cpu"), **shape.__dict__, "dtype": label},
        "decode": {
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "batches": args.batches,
            "ranks": args.ranks,
            "threads": torch.get_num_threads(),
            "clock": "cuda events" if device == "cuda" else "perf_counter",
        },
    }
    result["adapter_path"] = adapter_path_check(shape, torch, device, dtype)
    result["timing"] = [
        ldt.time_ranks(
            shape,
            torch,
            device,
            dtype,
            ranks=args.ranks,
            batch=b,
            prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens,
            warmup=args.warmup,
            repeats=args.repeats,
        )
        for b in args.batches
    ]
    if device == "cuda":
        from benchmarks.lora_alloc_figures import measure

        result["allocator"] = measure(shape, torch, dtype, label)
    else:
        result["allocator"] = {"skipped": "CPU run: the caching allocator and memory_snapshot() are CUDA-only"}
    result["checks"] = checks(result)
    result["ok"] = all(c["ok"] for c in result["checks"])
    return result


def checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = [
        {"check": "zero-B adapter leaves the logits equal", "ok": result["adapter_path"]["zero_b_equal"]},
        {"check": "random-B adapter changes the logits", "ok": result["adapter_path"]["random_b_differs"]},
        {
            "check": "adapter bytes by the guide's formula == PEFT's LoRA tensor bytes",
            "ok": all(r["adapter_bytes_match_peft"] for t in result["timing"] for r in t["rows"] if r["rank"]),
        },
    ]
    alloc = result["allocator"]
    if "rows" in alloc:
        added = alloc["rows"][1:]
        out.append(
            {
                "check": "each adapter adds its formula bytes to the probe's requested bytes",
                "ok": all(r["step_requested_bytes"] == r["formula_bytes"] == r["adapter_tensor_bytes"] for r in added),
            }
        )
        out.append(
            {
                "check": "every new LoRA tensor found in memory_snapshot()",
                "ok": all(r["blocks"]["modules_matched"] == r["blocks"]["modules"] > 0 for r in added),
            }
        )
    return out


def _mib(n: Any) -> str:
    return "–" if n is None else f"{n / 2**20:,.3f}"


def markdown(result: dict[str, Any]) -> str:
    dev, model, dec = result["device"], result["model"], result["decode"]
    lines = [
        f"Device: {dev['kind']} {dev['name']} ({dev['cpu_count']} CPUs; driver {dev.get('driver', '–')}; "
        f"torch CUDA {dev['torch_cuda']}); packages: "
        + ", ".join(f"{k} {v}" for k, v in result["packages"].items() if v),
        f"Model: Llama-shaped, random weights, hidden {model['hidden']}, {model['layers']} layers, heads "
        f"{model['heads']}/{model['kv_heads']} KV, MLP {model['intermediate']}, vocab {model['vocab']}, "
        f"{model['dtype']}. Decode: prompt {dec['prompt_tokens']}, {dec['new_tokens']} tokens, "
        f"{dec['warmup']} warm-up + {dec['repeats']} repeats, {dec['clock']}, {dec['threads']} threads.",
        "",
    ]
    for t in result["timing"]:
        lines += [
            f"Batch {t['batch']}:",
            "",
            "| variant | adapter bytes | mean ms/token | median ms/token | increment ms | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for r in t["rows"]:
            lines.append(
                f"| {r['variant']} | {r['adapter_bytes']:,} | {r['mean_ms']:.3f} | {r['median_ms']:.3f} | "
                f"{r['increment_median_ms']:+.3f} | {r['increment_ratio']:.3f} |"
            )
        fit = t["fit"]
        if fit["exponent"] is None:
            lines += ["", f"Fit increment = a·r^b: none ({fit['reason']}).", ""]
        else:
            lines += [
                "",
                f"Fit increment = a·r^b: b = {fit['exponent']} ± {fit['exponent_se']} (se, {fit['points']} points); "
                f"sub-linear: {fit['sublinear']} (b + 2se < 1: {fit['sublinear_2se']}).",
                "",
            ]
    alloc = result["allocator"]
    if "skipped" in alloc:
        lines.append(f"Allocator figures: skipped ({alloc['skipped']}).")
    else:
        lines += [
            f"Allocator (probe document; r{alloc['rank']} q/v alpha {alloc['alpha']}, {alloc['dtype']}), MiB:",
            "",
            "| adapters | requested | allocated | reserved | +requested | +allocated | +reserved | segments | "
            "per module asked / block B | fragmentation |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in alloc["rows"]:
            b = r.get("blocks")
            per = f"{b['requested_per_module_bytes']} / {b['block_per_module_bytes']}" if b else "–"
            lines.append(
                f"| {r['adapters']} | {_mib(r['requested_bytes'])} | {_mib(r['allocated_bytes'])} | "
                f"{_mib(r['reserved_bytes'])} | {_mib(r.get('step_requested_bytes'))} | "
                f"{_mib(r.get('step_allocated_bytes'))} | {_mib(r.get('step_reserved_bytes'))} | {r['segments']} | "
                f"{per} | {r['fragmentation_ratio']} |"
            )
    lines += ["", "Checks: " + "; ".join(f"{'PASS' if c['ok'] else 'FAIL'} {c['check']}" for c in result["checks"])]
    return "\n".join(lines) + "\n"


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/gpu-check/lora"), help="directory for the result")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when present")
    parser.add_argument("--size", choices=tuple(SIZES), help="model size (default: gpu on CUDA, cpu on a CPU)")
    parser.add_argument("--ranks", type=_ints, default=[2, 8, 32], help="LoRA ranks (default 2,8,32)")
    parser.add_argument("--batches", type=_ints, default=[1, 4], help="batch sizes (default 1,4)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32, help="decode steps per run (timed: all but the first)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed repeats first")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.prompt_tokens <= 0 or args.new_tokens < 2 or args.warmup < 0 or args.repeats <= 0 or args.threads < 0:
        parser.error("--prompt-tokens and --repeats must be positive, --new-tokens at least 2, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        torch = importlib.import_module("torch")
        importlib.import_module("peft")
        importlib.import_module("transformers")
    except Exception as err:
        print(f"gpu_lora_check: needs torch, transformers and peft ({type(err).__name__}: {err})", file=sys.stderr)
        return 2
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_lora_check: --device cuda but CUDA is not available (torch {torch.__version__})", file=sys.stderr)
        return 2
    start = time.perf_counter()
    result = run(args, torch)
    result["seconds"] = round(time.perf_counter() - start, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lora.json").write_text(json.dumps(result, indent=2))
    text = markdown(result)
    (args.out / "lora.md").write_text(text)
    print(text, end="")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
