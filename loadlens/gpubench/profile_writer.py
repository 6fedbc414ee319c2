"""A sim GPU profile from gpu-bench's measurements (``--write-profile measured.yaml``), so ``loadlens serve
--engine sim --gpu-profile ./measured.yaml`` simulates the user's own GPU.

The sim's roofline (docs/sim-engine.md §2) prices a step as max(FLOPs / (peak_tensor_flops ·
compute_efficiency), bytes / (hbm_bytes_per_s · memory_efficiency)). The peaks stay the datasheet's (of the
base profile); the two efficiencies are measured:

- ``compute_efficiency``: a prefill of ``REFERENCE_PREFILL`` tokens of the measured model spends its FLOPs in
  the linear modules (2 · layer linear params per token) and in causal attention (4·h·d per unmasked pair).
  Each part runs at its measured share of peak: the prefill GEMM points (FLOP-weighted) and the fastest
  attention backend at the sequence length nearest the reference. The efficiency is their FLOP-weighted
  harmonic mean: total FLOPs over the time the two parts take at those rates.
- ``memory_efficiency``: a decode step of ``REFERENCE_DECODE_BATCH`` sequences at ``REFERENCE_CONTEXT`` reads
  every linear weight once and the cached K and V (2 · kv_heads · d · 2 bytes per token per layer). Weights
  stream at the decode GEMM points' share of HBM (byte-weighted), K+V at the fastest decode backend's share at
  the context nearest the reference; the efficiency is their byte-weighted harmonic mean.

``memory_bytes`` is the device's total memory as torch reports it; ``marketing_name`` the device's name.
Every other field (power, clocks, thermal, overheads, LoRA costs) is the base profile's, and ``source`` says so.
A share above 1 (a shape served partly from cache) is capped at 1, the profile field's bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml

from loadlens.contracts.gpu_bench_result import GpuBenchResult
from loadlens.contracts.gpu_profile import GPUProfile, load_gpu_profile

REFERENCE_PREFILL = 2048
REFERENCE_CONTEXT = 4096
REFERENCE_DECODE_BATCH = 8


class ProfileWriteError(ValueError):
    """The measurements cannot make a profile; one line."""


def _harmonic(parts: Iterable[tuple[float, float]]) -> float:
    """Weighted harmonic mean of (weight, rate) pairs: Σw / Σ(w / rate)."""
    pairs = [(w, r) for w, r in parts if w > 0]
    return sum(w for w, _ in pairs) / sum(w / r for w, r in pairs)


def _nearest(values: Iterable[int], target: int) -> int:
    return min(values, key=lambda v: (abs(v - target), v))


def efficiencies(result: GpuBenchResult) -> tuple[float, float, dict[str, float]]:
    """(compute_efficiency, memory_efficiency, the parts they come from), uncapped."""
    peak, hbm, model = result.device.peak_tensor_flops, result.device.hbm_bytes_per_s, result.model
    if peak is None or hbm is None:
        raise ProfileWriteError("the device's peaks are unknown: pass --gpu-profile NAME to base the profile on one")
    dtype = result.settings.dtypes[0]
    gemm_prefill = [r for r in result.roofline if r.op == "gemm" and r.phase == "prefill" and r.tflops is not None]
    gemm_decode = [r for r in result.roofline if r.op == "gemm" and r.phase == "decode" and r.gb_per_s is not None]
    attn = [r for r in result.attention if r.dtype == dtype and r.tflops is not None]
    dec = [r for r in result.decode if r.dtype == dtype and r.gb_per_s is not None]
    missing = [name for name, rows in (("prefill GEMM", gemm_prefill), ("decode GEMM", gemm_decode),
                                       ("attention", attn), ("decode attention", dec)) if not rows]  # fmt: skip
    if missing:
        raise ProfileWriteError(f"no measured {', '.join(missing)} figure to derive the profile from")
    e_gemm = _harmonic((r.flops, r.tflops * 1e12 / peak) for r in gemm_prefill)  # type: ignore[operator]
    seq = _nearest({r.seq_len for r in attn}, REFERENCE_PREFILL)
    e_attn = max(r.tflops for r in attn if r.seq_len == seq) * 1e12 / peak  # type: ignore[type-var, operator]
    w_gemm = _harmonic((r.bytes, r.gb_per_s * 1e9 / hbm) for r in gemm_decode)  # type: ignore[operator]
    ctx = _nearest({r.context for r in dec}, REFERENCE_CONTEXT)
    w_kv = max(r.gb_per_s for r in dec if r.context == ctx) * 1e9 / hbm  # type: ignore[type-var, operator]

    linear = _layer_linear_params(result)
    s = REFERENCE_PREFILL
    gemm_flops = 2.0 * linear * s
    attn_flops = 4.0 * model.heads * model.head_dim * s * (s + 1) / 2
    compute = _harmonic(((gemm_flops, e_gemm), (attn_flops, e_attn)))
    weight_bytes = 2.0 * linear
    kv_bytes = REFERENCE_DECODE_BATCH * REFERENCE_CONTEXT * 2 * model.kv_heads * model.head_dim * 2.0
    memory = _harmonic(((weight_bytes, w_gemm), (kv_bytes, w_kv)))
    parts = {"prefill_gemm_share": e_gemm, "attention_share": e_attn, "attention_seq_len": float(seq),
             "decode_gemm_hbm_share": w_gemm, "decode_kv_hbm_share": w_kv, "decode_context": float(ctx)}  # fmt: skip
    return compute, memory, parts


def _layer_linear_params(result: GpuBenchResult) -> int:
    m = result.model
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    attention = m.hidden * q + 2 * m.hidden * kv + q * m.hidden
    return attention + (3 * m.hidden * m.intermediate if m.intermediate is not None else 0)


def profile_document(result: GpuBenchResult, base: GPUProfile, name: str) -> dict[str, object]:
    """The profile as a YAML mapping: the base profile's fields with the measured ones replaced."""
    if result.device.kind != "cuda":
        raise ProfileWriteError("a profile is written from a GPU run only (this was the CPU smoke test)")
    compute, memory, parts = efficiencies(result)
    doc: dict[str, object] = yaml.safe_load(Path(base.path).read_text(encoding="utf-8"))
    total = result.device.total_memory_bytes
    doc["name"] = name
    doc["marketing_name"] = result.device.name
    if total is not None:
        doc["memory_bytes"] = total
    doc["compute_efficiency"] = round(min(1.0, compute), 4)
    doc["memory_efficiency"] = round(min(1.0, memory), 4)
    doc["source"] = (
        f"measured by loadlens gpu-bench on {result.device.name} at {result.created} (torch "
        f"{result.device.torch_version}, CUDA {result.device.cuda_version}, model shape {result.model.name}): "
        f"compute_efficiency from prefill GEMM {parts['prefill_gemm_share']:.3f} and attention "
        f"{parts['attention_share']:.3f} of peak (seq {int(parts['attention_seq_len'])}), memory_efficiency from "
        f"decode GEMM {parts['decode_gemm_hbm_share']:.3f} and K+V read {parts['decode_kv_hbm_share']:.3f} of HBM "
        f"(context {int(parts['decode_context'])}); memory_bytes from torch; every other field from the packaged "
        f"profile {base.name} ({base.source.strip()})"
    )
    return doc


def write_profile(result: GpuBenchResult, base: GPUProfile, path: Path, name: str) -> GPUProfile:
    """Write the profile to ``path`` and load it back through the sim's loader (strict validation)."""
    doc = profile_document(result, base, name)
    header = "# Written by `loadlens gpu-bench --write-profile` (docs/gpu-bench.md); a sim GPU profile.\n"
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=110), encoding="utf-8")
    return load_gpu_profile(str(path) if "/" in str(path) else f"./{path}")
