"""A gpu_bench result built from the H200 figures recorded in issue 24 (an independent script on one H200,
driver 580.159, torch 2.11; /work/shared/reference/measured-h200.md "GPU chapter anchors"). Those figures are
rates; the rows are built from the times they imply, so the analysis turns them back into rates.

The issue has no GEMM or copy figures: the roofline rows here use ILLUSTRATIVE rates (70 % of peak for prefill
GEMMs, 3.6 TB/s for decode GEMMs and copies), chosen round so the profile arithmetic can be checked by hand;
they are not measurements.
"""

from __future__ import annotations

from loadlens.contracts.gpu_bench_result import GpuBenchResult, GraphRow, ModelShape
from loadlens.gpubench import counts
from loadlens.gpubench.plan import build_plan

PEAK = 989.5e12
HBM = 4800e9
SHAPES = ((512, 64), (2048, 16), (8192, 4))
CONTEXTS = (2048, 4096, 8192)
# Issue 24, 3.1 (TFLOP/s at 512x64 / 2048x16 / 8192x4; None: not measured there).
ATTENTION_TFLOPS: dict[tuple[str, str], tuple[float | None, ...]] = {
    ("cudnn", "bf16"): (569, 667, 625),
    ("flash", "bf16"): (249, 350, 338),
    ("efficient", "bf16"): (152, 174, 181),
    ("math", "bf16"): (22, 26, None),
    ("cudnn", "fp16"): (552, 639, 615),
    ("flash", "fp16"): (331, 342, 333),
}
# Issue 24, 3.2 (GB/s of K+V read at 2048 / 4096 / 8192, batch 8, bf16).
DECODE_GBPS: dict[str, tuple[float, ...]] = {
    "cudnn": (4074, 4294, 4435),
    "flash": (2565, 2692, 2752),
    "efficient": (2490, 2590, 2423),
}
PREFILL_GEMM_SHARE = 0.70  # illustrative
DECODE_GBPS_GEMM = 3600.0  # illustrative
LLAMA_8B = ModelShape(name="deepseek-r1-distill-llama-8b", layers=32, hidden=4096, heads=32, kv_heads=8,
                      head_dim=128, intermediate=14336)  # fmt: skip


def h200_result() -> GpuBenchResult:
    plan = build_plan(LLAMA_8B, quick=False, causal=False)
    attention = []
    for (backend, dtype), rates in ATTENTION_TFLOPS.items():
        for (seq, batch), rate in zip(SHAPES, rates, strict=True):
            flops = counts.attention_flops(batch, 32, seq, 128, causal=False)
            seconds = None if rate is None else [flops / (rate * 1e12)]
            attention.append(counts.attention_row(backend, dtype, seq, batch, 32, 128, causal=False,
                                                  seconds=seconds, peak_flops=PEAK, reason="skipped"))  # fmt: skip
    decode = []
    for backend, rates in DECODE_GBPS.items():
        for context, rate in zip(CONTEXTS, rates, strict=True):
            kv = counts.kv_read_bytes(8, 32, context, 128, "bf16")
            decode.append(counts.decode_row(backend, "bf16", context, 8, 32, 128, seconds=[kv / (rate * 1e9)], hbm=HBM))
    roofline = []
    for case in plan.gemms:
        if case.phase == "prefill":
            t = counts.gemm_flops(case.m, case.n, case.k) / (PREFILL_GEMM_SHARE * PEAK)
        else:
            t = counts.gemm_bytes(case.m, case.n, case.k, "bf16") / (DECODE_GBPS_GEMM * 1e9)
        roofline.append(counts.gemm_row(case.phase, case.label, case.m, case.n, case.k, "bf16", seconds=[t],
                                        peak_flops=PEAK, hbm=HBM))  # fmt: skip
    for copy in plan.copies:
        t = counts.copy_bytes(copy.numel, "bf16") / (DECODE_GBPS_GEMM * 1e9)
        roofline.append(counts.copy_row(copy.phase, copy.label, copy.numel, "bf16", seconds=[t], hbm=HBM))
    graph = GraphRow(layers=8, width=1024, heads=16, batch=32, dtype="bf16", first_call_seconds=0.138,
                     eager_step_seconds=1282e-6, capture_ok=True, capture_seconds=0.012, replay_step_seconds=399e-6,
                     speedup=1282 / 399)  # fmt: skip
    return GpuBenchResult.model_validate(
        {
            "kind": "loadlens-gpu-bench",
            "version": 1,
            "created": "2026-12-04T12:00:00+00:00",
            "device": {
                "kind": "cuda",
                "name": "NVIDIA H200",
                "total_memory_bytes": 150754820096,
                "compute_capability": "9.0",
                "multiprocessors": 132,
                "torch_version": "2.11.0+cu130",
                "cuda_version": "13.0",
                "cudnn_version": 91300,
                "flash_attn_version": None,
                "gpu_profile": "h200",
                "peak_tensor_flops": PEAK,
                "hbm_bytes_per_s": HBM,
            },  # fmt: skip
            "model": LLAMA_8B,
            "settings": {"warmup": 3, "iterations": 20, "quick": False, "causal": False, "dtypes": ["bf16", "fp16"]},
            "attention": attention,
            "decode": decode,
            "roofline": roofline,
            "graph": graph,
            "notes": ["figures from issue 24 (H200); GEMM and copy rows illustrative"],
        }
    )
