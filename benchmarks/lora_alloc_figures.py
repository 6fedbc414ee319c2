"""Guide 2.2 measured in this process (CUDA only): 1, 2, then 3 PEFT LoRA adapters (rank 8, q_proj/v_proj,
alpha 16) loaded into a Llama-shaped model, the caching allocator read after each.

The figures are the ones the GPU exporter would show: the in-process probe (``exporters.probe``) writes its
document after each load and the document's device entry is read back (requested, allocated, reserved,
segments, fragmentation ratio). Beside it, ``torch.cuda.memory_snapshot()`` gives each new LoRA tensor's
block (matched by the tensor's address): the block bytes it occupies against the bytes it asked for, per
module. Used by ``benchmarks/gpu_lora_check.py``.

Definitions (docs/probe-documents.md):
- rounding overhead = allocated - requested bytes (block rounding to 512 B and unsplit rests);
- fragmentation = 1 - largest free block / total free bytes, over the inactive blocks of the reserved
  segments (``loadlens.contracts.allocator_math.fragmentation``): 0 when the free space is one block.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.lora_decode_timing import ALPHA, TARGETS, DecodeShape, build_model, formula_bytes

RANK = 8
# Written on demand below, not by the probe's thread; a snapshot whenever asked (its back-off allowing).
PROBE_ENV = {"LOADLENS_PROBE_INTERVAL": "60", "LOADLENS_PROBE_SNAPSHOT_INTERVAL": "0.05"}
ADAPTERS = 3
DOC_FIELDS = (
    "requested_bytes",
    "allocated_bytes",
    "reserved_bytes",
    "rounding_overhead_bytes",
    "segments",
    "largest_free_block_bytes",
    "total_free_bytes",
    "fragmentation_ratio",
)


def block_sizes(snapshot: Iterable[Mapping[str, Any]], addresses: Iterable[int]) -> dict[int, int]:
    """Size of the allocated block that starts at each address, from a ``memory_snapshot()``."""
    wanted = set(addresses)
    out: dict[int, int] = {}
    for seg in snapshot:
        for block in seg.get("blocks", ()):
            addr = int(block.get("address", -1))
            if addr in wanted and str(block.get("state", "")).startswith("active"):
                out[addr] = int(block["size"])
    return out


def module_blocks(tensors: Mapping[str, Any], snapshot: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per LoRA module (one layer's q_proj or v_proj: its A and B): bytes asked and block bytes held."""
    sizes = block_sizes(snapshot, (t.data_ptr() for t in tensors.values()))
    modules: dict[str, dict[str, int]] = {}
    for name, t in tensors.items():
        module = name.split(".lora_")[0]
        m = modules.setdefault(module, {"requested": 0, "block": 0, "found": 0})
        m["requested"] += t.numel() * t.element_size()
        if t.data_ptr() in sizes:
            m["block"] += sizes[t.data_ptr()]
            m["found"] += 1
    found = [m for m in modules.values() if m["found"] == 2]
    req = sorted({m["requested"] for m in found})
    blk = sorted({m["block"] for m in found})
    return {
        "modules": len(modules),
        "modules_matched": len(found),
        "requested_per_module_bytes": req,
        "block_per_module_bytes": blk,
        "overhead_per_module_bytes": sorted({m["block"] - m["requested"] for m in found}),
    }


def _doc_device(probe: Any, fresh_snapshot: bool = True) -> dict[str, Any]:
    if fresh_snapshot:  # the probe snapshots when one is due; its interval is tiny here (set below)
        time.sleep(min(2.0, probe.snapshot_interval) + 0.01)
    probe.write_now()
    doc = json.loads(Path(probe.path).read_text())
    device = doc["devices"][0]
    return {k: device.get(k) for k in DOC_FIELDS} | {"pools": device.get("pools", [])}


def measure(shape: DecodeShape, torch: Any, dtype: Any, dtype_label: str) -> dict[str, Any]:
    """Base, then 1..3 adapters: the probe document's figures after each, steps against the previous row,
    and the per-module blocks of the adapter just added."""
    from peft import LoraConfig, get_peft_model

    from exporters.probe import start_probe

    saved = {k: os.environ.get(k) for k in PROBE_ENV}
    os.environ.update(PROBE_ENV)
    torch.cuda.empty_cache()
    directory = tempfile.mkdtemp(prefix="loadlens-lora-probe-")
    try:
        probe = start_probe("trainer", directory=directory, torch=torch)
    finally:  # the probe has read them; the process's environment is put back
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    if probe is None:
        raise RuntimeError("start_probe returned None (see the log line)")
    try:
        model = build_model(shape, torch, "cuda", dtype)
        torch.cuda.synchronize()
        rows = [{"adapters": 0, **_doc_device(probe)}]
        cfg = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS), lora_dropout=0.0)
        peft_model: Any = None
        for n in range(1, ADAPTERS + 1):
            name = f"a{n}"
            with warnings.catch_warnings():  # peft reads a deprecated transformers property: not ours
                warnings.simplefilter("ignore", FutureWarning)
                if peft_model is None:
                    peft_model = get_peft_model(model, cfg, adapter_name=name)
                else:
                    peft_model.add_adapter(name, cfg)
            torch.cuda.synchronize()
            row = {"adapters": n, **_doc_device(probe)}
            new = {k: p for k, p in peft_model.named_parameters() if f".{name}." in k and "lora_" in k}
            row["adapter_tensor_bytes"] = sum(p.numel() * p.element_size() for p in new.values())
            row["formula_bytes"] = formula_bytes(shape, RANK, dtype_label)
            row["blocks"] = module_blocks(new, torch.cuda.memory_snapshot())
            prev = rows[-1]
            for key in ("requested_bytes", "allocated_bytes", "reserved_bytes", "segments"):
                row[f"step_{key}"] = int(row[key] or 0) - int(prev[key] or 0)
            row["step_rounding_bytes"] = row["step_allocated_bytes"] - row["step_requested_bytes"]
            rows.append(row)
    finally:
        probe.stop()
    del model, peft_model
    torch.cuda.empty_cache()
    return {
        "rank": RANK,
        "alpha": ALPHA,
        "targets": list(TARGETS),
        "dtype": dtype_label,
        "rows": rows,
        "definitions": {
            "rounding_overhead_bytes": "allocated - requested",
            "fragmentation_ratio": "1 - largest free block / total free bytes (inactive blocks of reserved segments)",
            "step_*": "this row minus the previous row",
            "blocks": "the new adapter's tensors matched by address to memory_snapshot() blocks, per module",
        },
    }
