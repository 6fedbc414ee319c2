"""The GPU-efficiency alerts: the GPU's profiling counters (NVML GPM, the GPU exporter's ``gpm`` collector) and
the serving engine's MFU estimate (vLLM's ``vllm:estimated_*_per_gpu_total``, ``--enable-mfu-metrics``) read
while requests wait in the engine's queue. A GPU that is not full while work waits is the finding an SRE acts
on: idle SMs (the host does not feed it), HBM bandwidth at its ceiling (decode is memory-bound: the fix is
capacity or smaller bytes, not tuning), or neither roof near (the estimated MFU and MBU both low).

Thresholds: the SLO file's ``gpu`` section. The queue condition joins across processes with ``on()``: any
waiting request of the selected serving jobs, so each alert assumes the selected GPUs serve those engines
(one server per GPU set; narrow the selectors in ``alerting.selectors`` otherwise)."""

from __future__ import annotations

from typing import Any

from loadlens.alerting.rule_kit import Ctx, alert

WAITING = "vllm:num_requests_waiting"
MFU_COUNTERS = {
    "flops": "vllm:estimated_flops_per_gpu_total",
    "read": "vllm:estimated_read_bytes_per_gpu_total",
    "write": "vllm:estimated_write_bytes_per_gpu_total",
}
GPU_LABELS = "instance, gpu, uuid, model"


def gpu_efficiency_alert_group(c: Ctx) -> dict[str, Any]:
    g = c.slos.gpu
    s, serve = c.sel("gpu"), c.sel("serving")
    queued = f"on() (sum({c.engine(WAITING, lambda w: w)}) > 0)"
    mfu = f"avg(rate({MFU_COUNTERS['flops']}{serve}[5m])) / avg(loadlens_gpu_peak_flops_per_second{s})"
    moved = f"(avg(rate({MFU_COUNTERS['read']}{serve}[5m])) + avg(rate({MFU_COUNTERS['write']}{serve}[5m])))"
    mbu = f"{moved} / avg(loadlens_gpu_peak_memory_bytes_per_second{s})"
    sm_min, dram_max, tensor_low = g["gpm_sm_active_min"], g["gpm_dram_active_saturated"], g["gpm_tensor_active_low"]
    roof = g["roofline_use_min"]
    rules = [
        alert(
            "LoadlensGpuIdleWhileQueued",
            f"avg by ({GPU_LABELS}) (loadlens_gpu_gpm_sm_active_ratio{s}) < {sm_min}\nand {queued}",
            "5m",
            "warning",
            "Requests wait while the GPU's SMs are mostly idle.",
            "GPU {{ $labels.gpu }} ({{ $labels.model }}) has SMs active {{ $value | humanizePercentage }} of the "
            f"time (threshold {sm_min:.0%}) while the engine queues requests: the host does not feed the GPU "
            "(scheduling, tokenisation, adapter swaps) or the batch limits are too small.",
            component="gpu",
        ),
        alert(
            "LoadlensGpuMemoryBandwidthSaturated",
            f"avg by ({GPU_LABELS}) (loadlens_gpu_gpm_dram_active_ratio{s}) > {dram_max}"
            f"\nand on({GPU_LABELS}) avg by ({GPU_LABELS}) (loadlens_gpu_gpm_tensor_active_ratio{s}) < {tensor_low}"
            f"\nand {queued}",
            "10m",
            "warning",
            "Requests wait while the GPU is at its memory-bandwidth ceiling.",
            "GPU {{ $labels.gpu }} ({{ $labels.model }}) uses {{ $value | humanizePercentage }} of its DRAM "
            f"bandwidth (threshold {dram_max:.0%}) with tensor pipes under {tensor_low:.0%} while requests wait: "
            "decode is memory-bound; throughput grows only with fewer bytes per token (quantised weights or KV "
            "cache) or more GPUs.",
            component="gpu",
        ),
        alert(
            "LoadlensGpuRooflineUseLow",
            f"{mfu} < {roof}\nand {mbu} < {roof}\nand {queued}",
            "10m",
            "warning",
            "Requests wait while the estimated MFU and MBU are both low.",
            "Estimated MFU is {{ $value | humanizePercentage }} and MBU is under "
            f"{roof:.0%} too while requests wait: neither compute nor memory bandwidth limits the engine; it is "
            "latency-, launch- or host-bound (small batches, synchronisation, CUDA graphs off).",
            component="gpu",
        ),
    ]
    return {"name": "loadlens-gpu-efficiency", "rules": rules}
