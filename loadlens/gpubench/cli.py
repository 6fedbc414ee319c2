"""``loadlens gpu-bench``: the guide's chapter 3 on this machine's GPU (docs/gpu-bench.md).

Needs PyTorch and a CUDA GPU; without either it exits 2 with one line naming the cause. ``--device cpu`` is a
developer smoke test of the code path at tiny shapes (SDPA on the CPU, no CUDA graphs): labelled as such in
every output, without shares of peak, and it refuses ``--write-profile``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import platform
import sys
from pathlib import Path
from typing import Any

from loadlens.util.cliutil import UsageError, env_arg

ENV = "LOADLENS_GPU_BENCH_"
DEFAULT_MODEL = "deepseek-r1-distill-llama-8b"  # heads 32, head dim 128: the guide's attention shape
DEFAULT_OUT = Path("results/gpu-bench")
SECTIONS = ("graph", "attention", "decode", "roofline")
CPU_NOTE = (
    "CPU developer smoke test (--device cpu): exercises the code path at the given shapes; its figures say "
    "nothing about a GPU"
)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for item in (v.strip() for v in text.split(",") if v.strip()):
        seq, sep, batch = item.lower().partition("x")
        if not sep or not seq.isdigit() or not batch.isdigit() or int(seq) < 1 or int(batch) < 1:
            raise argparse.ArgumentTypeError(f"expected SEQxBATCH[,SEQxBATCH...], got {item!r}")
        out.append((int(seq), int(batch)))
    if not out:
        raise argparse.ArgumentTypeError("expected at least one SEQxBATCH")
    return tuple(out)


def _dtypes(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in ("bf16", "fp16")]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"expected bf16 and/or fp16, got {text!r}")
    return values


def _positive(text: str) -> int:
    (value,) = _ints(text)
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "gpu-bench",
        help="measure this GPU: attention TFLOP/s per SDPA backend, decode KV bandwidth, roofline, CUDA graphs",
        description=(
            "The guide's chapter 3 on this machine's GPU with PyTorch and random data (no download): prefill "
            "attention TFLOP/s and share of dense peak per SDPA backend (and flash_attn when installed), decode "
            "K+V read GB/s and share of HBM, GEMM and copy roofline points, a transformer step eager and as a "
            "CUDA graph. Prints the tables, writes gpu_bench.json (render it with loadlens report --results) "
            "and optionally a sim GPU profile from the measured efficiencies. Needs a CUDA GPU."
        ),
    )

    def arg(flag: str, **kw: Any) -> None:
        env_arg(p, flag, env_prefix=ENV, **kw)

    arg("--model", default=DEFAULT_MODEL, metavar="NAME|PATH",
        help="shapes from a packaged model profile, a profile YAML, a config.json or a model directory")  # fmt: skip
    arg("--gpu-profile", metavar="NAME|PATH",
        help="the GPU profile whose peaks the shares use and the written profile starts from (default: the "
             "packaged profile whose marketing_name is the device's name)")  # fmt: skip
    arg("--quick", action="store_true", help="the short form make gpu-check runs: bf16 only, 2 warm-ups, 10 iterations")
    arg("--causal", action="store_true", help="causal prefill attention (FLOPs counted as half the non-causal)")
    arg("--dtypes", type=_dtypes, metavar="LIST", help="bf16,fp16 (default: both; --quick: bf16)")
    arg("--shapes", type=_shapes, metavar="SxB,...", help="prefill attention shapes (default 512x64,2048x16,8192x4)")
    arg("--contexts", type=_ints, metavar="N,...", help="decode contexts (default 2048,4096,8192)")
    arg("--decode-batch", type=_positive, default=8, metavar="N", help="decode sequences")
    arg("--prefill-tokens", type=_positive, default=4096, metavar="N", help="GEMM rows of a prefill-like point")
    arg("--decode-tokens", type=_positive, default=8, metavar="N", help="GEMM rows of a decode-like point")
    arg("--graph-layers", type=_positive, default=8, metavar="N", help="layers of the CUDA-graph stack")
    arg("--graph-width", type=_positive, default=1024, metavar="N", help="width of the stack, a multiple of 64")
    arg("--graph-batch", type=_positive, default=32, metavar="N", help="sequences of one token per step")
    arg("--warmup", type=_positive, metavar="N", help="untimed calls before each measurement (default 3; quick 2)")
    arg("--iterations", type=_positive, metavar="N", help="timed calls, the median is kept (default 20; quick 10)")
    arg("--skip", action="append", choices=SECTIONS, default=[], help="leave a section out (repeatable)")
    arg("--out", type=Path, default=DEFAULT_OUT, metavar="DIR", help="where gpu_bench.json goes")
    arg("--write-profile", type=Path, metavar="PATH", help="also write a sim GPU profile from the measurements")
    arg("--profile-name", metavar="NAME", help="the written profile's name (default measured-<base profile>)")
    arg("--device", choices=("cuda", "cpu"), default="cuda",
        help="cpu: a developer smoke test of the code path (no CUDA graphs, no shares, no profile)")  # fmt: skip
    p.set_defaults(handler=run)


def torch_problem(torch: Any | None, device: str) -> str | None:
    """Why this process cannot measure on ``device``, in one line, or None."""
    if torch is None:
        return "needs PyTorch, which is not installed (pip install torch, a CUDA build for a GPU)"
    if device == "cpu":
        return None
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return f"no GPU: torch {torch.__version__} is a CPU-only build (install a CUDA build of torch)"
        return f"no GPU: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    return None


def _import_torch() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _flash_attn_version() -> str | None:
    try:
        return importlib.metadata.version("flash_attn")
    except importlib.metadata.PackageNotFoundError:
        return None


def device_info(torch: Any, device: str, gpu: Any | None) -> dict[str, Any]:
    peaks = {"gpu_profile": gpu.name if gpu is not None else None,
             "peak_tensor_flops": gpu.peak_tensor_flops if gpu is not None else None,
             "hbm_bytes_per_s": gpu.hbm_bytes_per_s if gpu is not None else None}  # fmt: skip
    if device == "cpu":
        return {"kind": "cpu", "name": platform.processor() or platform.machine(), "total_memory_bytes": None,
                "compute_capability": None, "multiprocessors": None, "torch_version": torch.__version__,
                "cuda_version": None, "cudnn_version": None, "flash_attn_version": None,
                "gpu_profile": None, "peak_tensor_flops": None, "hbm_bytes_per_s": None}  # fmt: skip
    props = torch.cuda.get_device_properties(0)
    return {
        "kind": "cuda",
        "name": torch.cuda.get_device_name(0),
        "total_memory_bytes": int(props.total_memory),
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": int(props.multi_processor_count),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version(),
        "flash_attn_version": _flash_attn_version(),
        **peaks,
    }


def _gpu_profile(args: argparse.Namespace, torch: Any) -> Any | None:
    from loadlens.contracts.gpu_profile import load_gpu_profile, profile_for_device
    from loadlens.contracts.profile_schema import ProfileError

    if args.gpu_profile:
        try:
            return load_gpu_profile(args.gpu_profile)
        except ProfileError as err:
            raise UsageError(f"--gpu-profile: {err}") from None
    if args.device == "cpu":
        return None
    return profile_for_device(torch.cuda.get_device_name(0))


def run(args: argparse.Namespace) -> int:
    from loadlens.gpubench.model_shape import ModelShapeError, model_shape
    from loadlens.gpubench.plan import build_plan

    if args.graph_width % 64:
        raise UsageError(f"--graph-width {args.graph_width}: must be a multiple of 64 (head dimension 64)")
    if args.write_profile is not None and args.device == "cpu":
        raise UsageError("--write-profile needs a GPU run (--device cpu is a smoke test)")
    try:
        shape = model_shape(args.model)
    except ModelShapeError as err:
        raise UsageError(f"--model: {err}") from None
    torch = _import_torch()
    problem = torch_problem(torch, args.device)
    if problem is not None:
        raise UsageError(problem)
    assert torch is not None
    gpu = _gpu_profile(args, torch)
    if args.write_profile is not None and gpu is None:
        raise UsageError(f"--write-profile: {torch.cuda.get_device_name(0)!r} matches no packaged GPU profile; "
                         "pass --gpu-profile NAME to base it on one")  # fmt: skip
    kwargs: dict[str, Any] = {k: v for k, v in (("attention", args.shapes), ("contexts", args.contexts)) if v}
    plan = build_plan(
        shape,
        quick=bool(args.quick),
        causal=bool(args.causal),
        dtypes=args.dtypes,
        decode_batch=args.decode_batch,
        prefill_tokens=args.prefill_tokens,
        decode_tokens=args.decode_tokens,
        graph=(args.graph_layers, args.graph_width, args.graph_batch),
        warmup=args.warmup,
        iterations=args.iterations,
        **kwargs,
    )
    result = measure_all(torch, plan, args.device, gpu, set(args.skip))
    from loadlens.gpubench.console import render

    print(render(result))
    out: Path = args.out
    try:
        out.mkdir(parents=True, exist_ok=True)
        from loadlens.contracts.gpu_bench_result import RESULT_FILE

        path = out / RESULT_FILE
        path.write_text(json.dumps(result.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    except OSError as err:
        print(f"loadlens gpu-bench: error: cannot write {out}: {err.strerror}", file=sys.stderr)
        return 1
    print(f"\nloadlens gpu-bench: {path}")
    if args.write_profile is not None:
        return _write_profile(result, gpu, args)
    return 0


def _write_profile(result: Any, gpu: Any, args: argparse.Namespace) -> int:
    from loadlens.contracts.profile_schema import ProfileError
    from loadlens.gpubench.profile_writer import ProfileWriteError, write_profile

    name = args.profile_name or f"measured-{gpu.name}"
    try:
        written = write_profile(result, gpu, args.write_profile, name)
    except ProfileWriteError as err:
        print(f"loadlens gpu-bench: error: --write-profile: {err}", file=sys.stderr)
        return 1
    except (OSError, ProfileError) as err:
        print(f"loadlens gpu-bench: error: --write-profile {args.write_profile}: {err}", file=sys.stderr)
        return 1
    print(f"loadlens gpu-bench: sim GPU profile {written.path} (compute_efficiency "
          f"{written.compute_efficiency}, memory_efficiency {written.memory_efficiency}); use it with "
          f"loadlens serve --engine sim --gpu-profile {written.path}")  # fmt: skip
    return 0


def measure_all(torch: Any, plan: Any, device: str, gpu: Any | None, skip: set[str]) -> Any:
    """Run the plan's sections (the graph step first: its first call is the process's first forward)."""
    from loadlens.contracts.gpu_bench_result import KIND, VERSION, GpuBenchResult
    from loadlens.gpubench import graph_step, measure

    timer = measure.cuda_timer(torch) if device == "cuda" else measure.cpu_timer()
    peak = gpu.peak_tensor_flops if gpu is not None else None
    hbm = gpu.hbm_bytes_per_s if gpu is not None else None
    info = device_info(torch, device, gpu)
    notes: list[str] = []
    if device == "cpu":
        notes.append(CPU_NOTE)
    elif gpu is None:
        notes.append(f"{info['name']!r} matches no packaged GPU profile: shares of peak are null "
                     "(pass --gpu-profile NAME to use one's peaks)")  # fmt: skip
    if device == "cuda" and measure.flash_attn_func() is None:
        notes.append("flash_attn package not installed: its rows are absent")
    torch.manual_seed(0)
    graph = graph_step.measure(torch, plan, device, timer) if "graph" not in skip else None
    attention = measure.attention(torch, plan, device, timer, peak) if "attention" not in skip else []
    decode = measure.decode(torch, plan, device, timer, hbm) if "decode" not in skip else []
    roofline = measure.roofline(torch, plan, device, timer, peak, hbm) if "roofline" not in skip else []
    return GpuBenchResult.model_validate(
        {
            "kind": KIND,
            "version": VERSION,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device": info,
            "model": plan.model,
            "settings": {
                "warmup": plan.warmup,
                "iterations": plan.iterations,
                "quick": plan.quick,
                "causal": plan.causal,
                "dtypes": list(plan.dtypes),
            },
            "attention": attention,
            "decode": decode,
            "roofline": roofline,
            "graph": graph,
            "notes": notes,
        }
    )
