"""The sim GPU profile ``loadlens calibrate --profile OUT.yaml`` writes (docs/calibration.md, *Output*): a copy
of a base GPU profile whose step-time fields are the fit's. The fitted facts have one home each, the GPU
profile's existing fields:

- ``step_overhead_seconds`` (and ``layer_overhead_seconds`` 0: the fit has one fixed cost per step);
- ``per_seq_overhead_seconds``;
- ``peak_tensor_flops`` = 1 / seconds per FLOP with ``compute_efficiency`` 1;
- ``hbm_bytes_per_s`` = 1 / seconds per byte moved (weights + K and V) with ``memory_efficiency`` 1;
- ``default_knobs.insertion_overhead_us``;
- ``default_knobs.num_gpu_blocks``, the KV capacity the server stated (``kv.py``), where it stated one;
- ``default_knobs.max_num_seqs``, ``max_num_batched_tokens`` and ``async_scheduling``, the server's scheduler
  limits and whether it plans ahead (given to calibrate, or the base profile's);
- ``frontend_fixed_seconds`` and ``frontend_per_running_seconds``, the frontend fit's (absent: 0);
- ``step_spread_seconds``, the logged steps' spread around their mean (``step_spread.py``), where calibrate measured
  one; else none, whatever the base profile had (a spread is a measured engine's, not the base's);
- ``decode_step_offsets_seconds``, the logged decode step by batch against the fit (``decode_offsets.py``), the
  same way.

A term the data did not identify is written as free: ``peak_tensor_flops`` or ``hbm_bytes_per_s`` 1e30 (the
term is then ~0 s), the overheads 0. Memory, power, clocks, LoRA and thermal fields stay the base's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from exporters.serving.calibrate.fit import FitResult
from exporters.serving.calibrate.frontend_fit import FrontendFit
from loadlens.contracts.gpu_profile import GPUProfile, load_gpu_profile

FREE = 1e30
"""Throughput written for a term the data did not identify: its seconds are ~0."""


def profile_document(
    fit: FitResult,
    base: GPUProfile,
    name: str,
    source: str,
    kv_blocks: int | None = None,
    frontend: FrontendFit | None = None,
    scheduler: Mapping[str, int | bool] | None = None,
    step_spread: Sequence[float] = (),
    decode_offsets: Sequence[float] = (),
) -> dict[str, object]:
    doc: dict[str, object] = yaml.safe_load(Path(base.path).read_text(encoding="utf-8"))
    v = fit.values
    doc["name"] = name
    doc["source"] = f"{source}; every other field from the packaged profile {base.name}"
    doc["step_overhead_seconds"] = float(f"{v['step_overhead_s']:.6g}")
    doc["per_seq_overhead_seconds"] = float(f"{v['per_seq_s']:.6g}")
    doc["layer_overhead_seconds"] = 0.0
    doc["peak_tensor_flops"] = float(f"{1 / v['s_per_flop']:.6g}") if v["s_per_flop"] > 0 else FREE
    doc["compute_efficiency"] = 1.0
    doc["hbm_bytes_per_s"] = float(f"{1 / v['s_per_byte']:.6g}") if v["s_per_byte"] > 0 else FREE
    doc["memory_efficiency"] = 1.0
    knobs = dict(doc.get("default_knobs") or {})  # type: ignore[call-overload]
    knobs["insertion_overhead_us"] = round(v["insertion_s"] * 1e6, 3)
    if kv_blocks is not None:
        knobs["num_gpu_blocks"] = kv_blocks
    knobs.update(scheduler or {})
    doc["default_knobs"] = knobs
    f = frontend.values if frontend is not None else {}
    doc["frontend_fixed_seconds"] = float(f"{f.get('frontend_fixed_s', 0.0):.6g}")
    doc["frontend_per_running_seconds"] = float(f"{f.get('frontend_per_running_s', 0.0):.6g}")
    doc.pop("step_spread_seconds", None)
    if step_spread:
        doc["step_spread_seconds"] = [float(v) for v in step_spread]
    doc.pop("decode_step_offsets_seconds", None)
    if decode_offsets:
        doc["decode_step_offsets_seconds"] = [float(v) for v in decode_offsets]
    return doc


def write_profile(
    fit: FitResult,
    base: GPUProfile,
    path: Path,
    name: str,
    source: str,
    kv_blocks: int | None = None,
    frontend: FrontendFit | None = None,
    scheduler: Mapping[str, int | bool] | None = None,
    step_spread: Sequence[float] = (),
    decode_offsets: Sequence[float] = (),
) -> GPUProfile:
    """Write the profile and load it back through the sim's loader (strict validation)."""
    doc = profile_document(fit, base, name, source, kv_blocks, frontend, scheduler, step_spread, decode_offsets)
    header = "# Written by `loadlens calibrate` (docs/calibration.md); a sim GPU profile.\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=110), encoding="utf-8")
    return load_gpu_profile(str(path) if "/" in str(path) else f"./{path}")
