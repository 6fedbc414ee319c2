"""Real-GPU check of the in-process allocator probe, read by the GPU exporter (``--probe-dir``).

Runs in one process on a host with CUDA (well under 2 minutes on an H200)::

    python -m benchmarks.gpu_probe_check --out results/gpu-check/probe

Numbered steps, each with PASS/FAIL checks and the figures behind them (docs/probe-documents.md, "GPU check"):

1. ``start_probe("trainer", directory=tmp, torch=torch)`` and an in-process ``GpuExporter`` (nvml backend,
   ``probe`` collector on that directory); the scrape shows the document and the join to NVML's GPU by UUID.
2. Guide 2.2's allocation pattern on an empty caching allocator: 3 "adapters" of 8 requests of 1.2 MB.
   Reserved, allocated and requested bytes, as the exporter shows them, must equal a simulation of PyTorch's
   documented block rules (``simulate``): VRAM grows in 20 MiB segment steps, not 2 MB per module.
3. A randomly initialised Llama-shaped model on CUDA with 1 PEFT LoRA adapter (rank 8, q_proj/v_proj): the
   exporter's requested bytes grow by exactly the adapter's tensor bytes, allocated by their 512 B rounding.
4. Adapters 2 and 3 (``add_adapter``): the same per adapter; reserved moves only in 2 MiB multiples; the
   small pool's segments are 2 MiB each.
5. 10 real training steps with ``TrainingTelemetry`` (its own probe, role trainer, via LOADLENS_PROBE_DIR):
   grad norm > 0, VRAM step peak set, the exporter sees role trainer; detach removes the document.
6. Cost of ``torch.cuda.memory_snapshot()`` and of the probe's reduction, at the live segment count and
   after a fragmenting pattern (tens of thousands of blocks).

A step that raises is recorded as FAIL with the error and the run goes on. Under ``--out``: ``report.json``
(every step, check and figure), ``gpu_probe_check.log`` (the text printed), the expositions
``probe-*.prom`` and ``probe-document.json``. Exit 0 when every check passes, 1 when one fails, 2 (one line,
no traceback) when torch or CUDA is absent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.caching_allocator import (
    GUIDE_ADAPTERS,
    GUIDE_MODULES,
    GUIDE_REQUEST,
    LARGE_BUFFER,
    MIB,
    MIN_BLOCK,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SMALL_BUFFER,
    SMALL_SIZE,
    ModelShape,
    SimState,
    expected_adapter,
    lora_module_bytes,
    simulate,
)
from benchmarks.gpu_probe_rig import Report, Rig, cuda_missing, versions
from benchmarks.lora_decode_timing import llama_config

# --- the steps ------------------------------------------------------------------------------------------


def _delta(after: dict[str, Any], before: dict[str, Any], key: str) -> int:
    return int((after[key] or 0) - (before[key] or 0))


def step_rig(report: Report, rig: Rig) -> None:
    from exporters.gpu.nvml import Nvml
    from exporters.gpu.server import GpuExporter
    from exporters.probe import start_probe

    # Stats every second in the background; snapshots as often as the back-off allows, so each scrape
    # below sees a snapshot of the state it measures.
    os.environ["LOADLENS_PROBE_INTERVAL"] = "1"
    os.environ["LOADLENS_PROBE_SNAPSHOT_INTERVAL"] = "0.05"
    rig.probe = start_probe("trainer", directory=rig.directory, torch=rig.torch)
    report.check("start_probe returns a probe", rig.probe is not None, str(getattr(rig.probe, "path", None)))
    rig.exporter = GpuExporter(
        Nvml(), backend="nvml", collectors=["memory", "probe"], probe_dir=str(rig.directory), proc_root="/proc"
    )
    rig.exporter.start()
    fig = rig.scrape("start", fresh_snapshot=False)
    report.check("probe collector succeeds", fig["collector_ok"] == 1, fig["collector_ok"])
    report.check("one document kept, none dropped", fig["documents"] == 1 and not fig["dropped"], fig)
    report.check("role trainer exported", fig["roles"] == ["trainer"], fig["roles"])


def step_guide_pattern(report: Report, rig: Rig, values: dict[str, Any]) -> None:
    torch = rig.torch
    torch.cuda.init()
    before = rig.scrape(fresh_snapshot=False)
    values["before"] = before
    report.check("allocator empty before the pattern", (before["reserved"] or 0) == 0, before["reserved"])
    held: list[Any] = []
    state = SimState()
    series = []
    for adapter in range(1, GUIDE_ADAPTERS + 1):
        sizes = [GUIDE_REQUEST] * GUIDE_MODULES
        held += [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]
        simulate(sizes, state)
        fig = rig.scrape(f"guide-{adapter}" if adapter in (1, GUIDE_ADAPTERS) else None)
        want = {"reserved": state.reserved, "allocated": state.allocated, "requested": state.requested}
        got = {k: int(fig[k] or 0) - int(before[k] or 0) for k in want}
        series.append({"adapter": adapter, "want": want, "got": got, "overhead": fig["rounding_overhead"]})
        report.check(f"guide pattern, {adapter} adapter(s): exporter == simulation", got == want, {"got": got})
    values["series"] = series
    steps = [series[0]["got"]["reserved"]] + [
        b["got"]["reserved"] - a["got"]["reserved"] for a, b in zip(series, series[1:], strict=False)
    ]
    values["reserved_steps"] = steps
    report.check(
        "VRAM grows in 20 MiB segment steps (0 or 20 MiB per adapter), not 2 MB per module",
        all(s % LARGE_BUFFER == 0 for s in steps) and 0 in steps,
        [s / MIB for s in steps],
    )
    overhead = series[-1]["got"]["allocated"] - series[-1]["got"]["requested"]
    report.check(
        "rounding overhead: 128 B per 1.2 MB block plus one unsplit segment tail",
        overhead == state.rounding_overhead and overhead > 0,
        f"{overhead} B (simulated {state.rounding_overhead} B)",
    )
    del held
    torch.cuda.empty_cache()
    after = rig.scrape(fresh_snapshot=False)
    report.check("empty_cache gives it all back", (after["reserved"] or 0) == 0, after["reserved"])


def build_model(shape: ModelShape, torch: Any) -> Any:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = llama_config(shape, max_positions=512)
    with torch.device("cuda"):  # initialised on the GPU: seconds faster than on the host and a copy
        model: Any = LlamaForCausalLM(config)
    return model.to(dtype=torch.float32)


def lora_config(shape: ModelShape) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=shape.rank, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def step_first_adapter(report: Report, rig: Rig, shape: ModelShape, values: dict[str, Any]) -> Any:
    from peft import get_peft_model

    want = expected_adapter(shape)
    values["expected_per_adapter"] = want
    values["module_bytes"] = lora_module_bytes(shape)
    base = build_model(shape, rig.torch)
    before = rig.scrape("base")
    model = get_peft_model(base, lora_config(shape))
    fig = rig.scrape("1-adapter")
    values["base"], values["one_adapter"] = before, fig
    dtypes = sorted({str(p.dtype) for n, p in model.named_parameters() if "lora_" in n})
    report.check("adapter weights are fp32 (the dtype the expectation uses)", dtypes == ["torch.float32"], dtypes)
    report.check("exporter joins the probe to NVML's GPU by UUID", fig["gpu_label"] == "0", fig["gpu_label"])
    d_req, d_alloc = _delta(fig, before, "requested"), _delta(fig, before, "allocated")
    report.check("requested grows by the adapter's bytes exactly", d_req == want["requested_bytes"], d_req)
    report.check(
        "allocated grows by the 512 B-rounded bytes",
        want["allocated_bytes_min"] <= d_alloc <= want["allocated_bytes_max"],
        d_alloc,
    )
    d_res = _delta(fig, before, "reserved")
    report.check("reserved moves in 2 MiB multiples", d_res % SMALL_BUFFER == 0, d_res)
    report.check("rounding overhead > 0 (whole process)", (fig["rounding_overhead"] or 0) > 0, fig["rounding_overhead"])
    report.check("fragmentation ratio exported", fig["fragmentation_ratio"] is not None, fig["fragmentation_ratio"])
    return model


def step_more_adapters(report: Report, rig: Rig, shape: ModelShape, model: Any, values: dict[str, Any]) -> None:
    if model is None:
        raise RuntimeError("needs the model of step 3")
    want = expected_adapter(shape)
    series = [values.get("one_adapter") or rig.scrape()]
    for name in ("second", "third"):
        model.add_adapter(name, lora_config(shape))
        series.append(rig.scrape("3-adapters" if name == "third" else None))
    values["series"] = series
    d_req = [_delta(b, a, "requested") for a, b in zip(series, series[1:], strict=False)]
    d_alloc = [_delta(b, a, "allocated") for a, b in zip(series, series[1:], strict=False)]
    d_res = [_delta(b, a, "reserved") for a, b in zip(series, series[1:], strict=False)]
    values["deltas"] = {"requested": d_req, "allocated": d_alloc, "reserved": d_res}
    report.check("each adapter adds its bytes to requested", all(d == want["requested_bytes"] for d in d_req), d_req)
    report.check(
        "each adapter adds its rounded bytes to allocated",
        all(want["allocated_bytes_min"] <= d <= want["allocated_bytes_max"] for d in d_alloc),
        d_alloc,
    )
    report.check(
        "reserved grows in steps: 2 MiB multiples while allocated grows by less",
        all(d % SMALL_BUFFER == 0 for d in d_res) and d_res != d_alloc,
        [d / MIB for d in d_res],
    )
    last = series[-1]
    small = {k: v for k, v in last["pools"].items() if k.startswith("small/")}
    ok = bool(small) and all(
        v["reserved_bytes"] == v["segments"] * SMALL_BUFFER and k == "small/le_2mib" for k, v in small.items()
    )
    report.check("small-pool segments are 2 MiB each", ok, small)
    report.check(
        "fragmentation ratio in [0, 1)", 0 <= (last["fragmentation_ratio"] or 0) < 1, last["fragmentation_ratio"]
    )


def step_training(report: Report, rig: Rig, model: Any, values: dict[str, Any], steps: int = 10) -> None:
    if model is None:
        raise RuntimeError("needs the model of step 3")
    torch = rig.torch
    from exporters.training.hook import TrainingTelemetry

    # The hook starts its own probe (role trainer) from LOADLENS_PROBE_DIR; one document per process, so
    # the rig's probe stops first.
    if rig.probe is not None:
        rig.probe.stop()
        rig.probe = None
    os.environ["LOADLENS_PROBE_DIR"] = str(rig.directory)
    telemetry = TrainingTelemetry("gpu-check").attach(model)
    try:
        probe = telemetry._probe  # the hook's probe: read only, to write its document at once
        report.check("the hook started a probe", probe is not None, str(getattr(probe, "path", None)))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        gen = torch.Generator(device="cuda").manual_seed(0)
        vocab = int(model.config.vocab_size)
        reports = []
        for _ in range(steps):
            ids = torch.randint(0, vocab, (4, 128), device="cuda", generator=gen)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            reports.append(telemetry.after_step(loss=float(loss), lr=1e-3))
            opt.zero_grad()
        norms = [r.grad_norm for r in reports]
        peaks = [r.vram_peak_bytes for r in reports]
        values["grad_norms"], values["vram_peaks"] = norms, peaks
        values["step_seconds"] = [round(r.step_seconds, 4) for r in reports]
        report.check("grad norm > 0 every step", all(n is not None and n > 0 for n in norms), norms[-1])
        reg = telemetry.metrics.registry
        peak = reg.get_sample_value("loadlens_training_vram_step_peak_bytes", {"run": "gpu-check"})
        report.check("VRAM step peak series set", peak is not None and peak > 0, peak)
        rig.probe = probe
        fig = rig.scrape("training")
        rig.probe = None
        values["after_training"] = fig
        report.check("exporter sees the hook's document, role trainer", fig["roles"] == ["trainer"], fig["roles"])
        doc_path = Path(str(getattr(probe, "path", "")))
        if doc_path.is_file():
            doc = json.loads(doc_path.read_text())
            (rig.out / "probe-document.json").write_text(json.dumps(doc, indent=1))
            report.check(
                "document role trainer, one device", doc["role"] == "trainer" and len(doc["devices"]) == 1, doc["role"]
            )
    finally:
        telemetry.detach()
    left = [p.name for p in rig.directory.iterdir() if not p.name.startswith(".")]
    report.check("detach removes the document", not left, left)


def _time(fn: Callable[[], Any], n: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(n):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def snapshot_cost(torch: Any, repeats: int = 5) -> dict[str, Any]:
    from exporters.probe.reading import summarise_snapshot

    snap_s, snap = _time(lambda: torch.cuda.memory_snapshot(), repeats)
    segments = len(snap)
    blocks = sum(len(seg.get("blocks", ())) for seg in snap)
    reduce_s, _ = _time(lambda: summarise_snapshot(snap, [torch.cuda.current_device()], time.time()), repeats)
    snap = []  # drop the snapshot's Python objects before the next measurement
    return {
        "segments": segments,
        "blocks": blocks,
        "memory_snapshot_ms": round(snap_s * 1000, 3),
        "summarise_ms": round(reduce_s * 1000, 3),
        "us_per_block": round((snap_s + reduce_s) * 1e6 / max(1, blocks), 3),
    }


def step_snapshot_cost(report: Report, rig: Rig, values: dict[str, Any], fragments: int) -> None:
    torch = rig.torch
    live = snapshot_cost(torch)
    values["live"] = live
    report.check("snapshot cost at the live state", live["segments"] > 0, live)
    # Many blocks: odd small sizes (small pool) and 1-4 MiB ones (large pool), every other one freed.
    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(1, 64, (fragments,), generator=gen).tolist()
    held = [
        torch.empty(s * 4096 + 100 if i % 4 else s * 65536, dtype=torch.uint8, device="cuda")
        for i, s in enumerate(sizes)
    ]
    del held[::2]
    torch.cuda.synchronize()
    many = snapshot_cost(torch)
    values["fragmented"] = many
    report.check("snapshot cost with many blocks", many["blocks"] > live["blocks"], many)
    del held
    torch.cuda.empty_cache()


def run(out: Path, shape: ModelShape, train_steps: int, fragments: int, log: Callable[[str], None]) -> Report:
    import torch

    report = Report(log)
    report.data["packages"] = versions()
    report.data["gpu"] = torch.cuda.get_device_name(0)
    report.data["shape"] = shape.__dict__
    report.data["rules"] = {
        "min_block": MIN_BLOCK,
        "small_size": SMALL_SIZE,
        "small_segment": SMALL_BUFFER,
        "large_segment": LARGE_BUFFER,
        "min_large_alloc": MIN_LARGE_ALLOC,
        "round_large": ROUND_LARGE,
        "alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")),
    }
    directory = Path(tempfile.mkdtemp(prefix="loadlens-probe-"))
    rig = Rig(out, directory, torch)
    model: Any = None
    try:
        with report.step("probe and exporter in-process"):
            step_rig(report, rig)
        with report.step(f"guide 2.2 pattern: {GUIDE_ADAPTERS} x {GUIDE_MODULES} requests of 1.2 MB") as v:
            step_guide_pattern(report, rig, v)
        with report.step("Llama-shaped model + 1 PEFT LoRA adapter (r=8, q_proj/v_proj)") as v:
            model = step_first_adapter(report, rig, shape, v)
        with report.step("adapters 2 and 3") as v:
            step_more_adapters(report, rig, shape, model, v)
        with report.step(f"{train_steps} training steps with TrainingTelemetry") as v:
            step_training(report, rig, model, v, train_steps)
        with report.step("snapshot cost") as v:
            step_snapshot_cost(report, rig, v, fragments)
    finally:
        if rig.probe is not None:
            rig.probe.stop()
        if rig.exporter is not None:
            with contextlib.suppress(Exception):
                rig.exporter.stop()
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/gpu-check/probe"), help="directory for the report")
    parser.add_argument("--hidden", type=int, default=ModelShape.hidden, help="model hidden size")
    parser.add_argument("--layers", type=int, default=ModelShape.layers, help="decoder layers")
    parser.add_argument("--steps", type=int, default=10, help="training steps in step 5")
    parser.add_argument("--fragments", type=int, default=20000, help="tensors of the fragmenting pattern in step 6")
    args = parser.parse_args(argv)
    if args.hidden % ModelShape.heads or args.hidden <= 0 or args.layers <= 0 or args.steps <= 0:
        parser.error(f"--hidden must be a positive multiple of {ModelShape.heads}; --layers, --steps positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reason = cuda_missing()
    if reason is not None:
        print(f"gpu_probe_check: {reason}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    shape = ModelShape(hidden=args.hidden, layers=args.layers)
    start = time.perf_counter()
    report = Report(log)
    try:
        report = run(args.out, shape, args.steps, args.fragments, log)
    finally:
        result = report.as_json()
        result["seconds"] = round(time.perf_counter() - start, 1)
        log(f"{result['passed']} passed, {result['failed']} failed in {result['seconds']} s")
        (args.out / "report.json").write_text(json.dumps(result, indent=2, default=str))
        (args.out / "gpu_probe_check.log").write_text("\n".join(lines) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
