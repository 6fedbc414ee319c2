"""The GPU & VRAM dashboard: utilisation and its swing, VRAM, fragmentation, power, thermals, clocks, XID.

The ratio thresholds come from the SLO file's ``gpu`` section, baked in at generation time.
"""

from __future__ import annotations

from loadlens.contracts.ports import GPU_JOB, SERVE_JOB, job_selector
from loadlens.contracts.slo import SLOConfig
from loadlens.dashboards.common import GPU, alerts_annotation, stage_annotation, variables
from loadlens.dashboards.model import Dashboard, Panel, Row, Target, Threshold, increase, rate


def dashboard(slos: SLOConfig) -> Dashboard:
    g = slos.gpu
    serve = job_selector(SERVE_JOB)
    flops = f"avg({rate('vllm:estimated_flops_per_gpu_total', serve)})"
    moved = (
        f"avg({rate('vllm:estimated_read_bytes_per_gpu_total', serve)}"
        f" + {rate('vllm:estimated_write_bytes_per_gpu_total', serve)})"
    )
    util = Row(
        "Utilisation",
        (
            Panel(
                "GPU utilisation",
                "percentunit",
                (
                    Target(f"loadlens_gpu_utilization_ratio{{{GPU}}}", "gpu {{gpu}} now"),
                    Target(f"loadlens_gpu_utilization_window_mean_ratio{{{GPU}}}", "gpu {{gpu}} window mean"),
                    Target(f"loadlens_gpu_utilization_window_p95_ratio{{{GPU}}}", "gpu {{gpu}} window p95"),
                    Target(f"loadlens_gpu_utilization_window_p5_ratio{{{GPU}}}", "gpu {{gpu}} window p5"),
                ),
                "Share of the driver's sample period in which a kernel ran (not SM occupancy), and window statistics.",
                min=0,
                max=1,
            ),
            Panel(
                "Utilisation swing (p95 − p5)",
                "percentunit",
                (
                    Target(
                        f"loadlens_gpu_utilization_window_peak_to_trough_ratio{{{GPU}}}", "gpu {{gpu}} peak-to-trough"
                    ),
                    Target(f"loadlens_gpu_utilization_window_stddev_ratio{{{GPU}}}", "gpu {{gpu}} stddev"),
                    Target(
                        f"max by (gpu) (loadlens_gpu_busy_swing_ratio{{{GPU}}})", "gpu {{gpu}} busy timeline (10 ms)"
                    ),
                ),
                "Utilisation peak-to-trough: NVML's samples over the window (coarse, ~1/6 s each) and, where a probe "
                "or the sim records one, the busy timeline's 10 ms bins over 10 s (the swing alert's figure there); "
                f"line: {g['util_peak_to_trough_ratio']:.0%} threshold.",
                threshold=Threshold(g["util_peak_to_trough_ratio"]),
                min=0,
            ),
            Panel(
                "Utilisation swing period",
                "s",
                (
                    Target(f"loadlens_gpu_utilization_swing_period_seconds{{{GPU}}}", "gpu {{gpu}} period"),
                    Target(f"loadlens_gpu_utilization_sample_interval_seconds{{{GPU}}}", "gpu {{gpu}} sample interval"),
                    Target(
                        f"max by (gpu) (loadlens_gpu_busy_period_seconds{{{GPU}}})", "gpu {{gpu}} busy timeline period"
                    ),
                ),
                "Dominant period of the swing (absent when flat); periods under 2× the sample interval are invisible "
                "in NVML's samples. The busy timeline's period comes from 1 ms bins: it resolves the guide's 29 ms.",
            ),
            Panel(
                "SM and tensor activity (GPM)",
                "percentunit",
                (
                    Target(f"loadlens_gpu_gpm_sm_active_ratio{{{GPU}}}", "gpu {{gpu}} SM active"),
                    Target(f"loadlens_gpu_gpm_tensor_active_ratio{{{GPU}}}", "gpu {{gpu}} tensor active"),
                    Target(f"loadlens_gpu_gpm_dram_active_ratio{{{GPU}}}", "gpu {{gpu}} DRAM bandwidth"),
                ),
                "NVML GPM profiling counters over the exporter's pass interval (Hopper and newer; absent elsewhere): "
                "SM cycles with a warp resident, tensor pipes busy, DRAM bandwidth used. Unlike utilisation, these "
                "show how much of the GPU the kernels fill.",
                min=0,
                max=1,
            ),
            Panel(
                "MFU / MBU (estimated)",
                "percentunit",
                (
                    Target(f"{flops} / avg(loadlens_gpu_peak_flops_per_second{{{GPU}}})", "MFU"),
                    Target(f"{moved} / avg(loadlens_gpu_peak_memory_bytes_per_second{{{GPU}}})", "MBU"),
                ),
                "Model FLOPs and memory-bandwidth utilisation: the serving engines' estimated FLOPs and HBM bytes "
                "per GPU per second (vLLM's --enable-mfu-metrics counters, from vLLM, the sim or loadlens's "
                "proxy) over the GPUs' datasheet peaks (their packaged GPU profile). Engine mean over GPU mean: "
                "assumes the selected GPUs are one model and all serve. Compare with utilisation and GPM's tensor "
                "and DRAM activity: a busy GPU far below its peak is latency- or launch-bound.",
                min=0,
            ),
        ),
    )
    vram = Row(
        "VRAM",
        (
            Panel(
                "VRAM used / reserved / total",
                "bytes",
                (
                    Target(f"loadlens_gpu_memory_used_bytes{{{GPU}}}", "gpu {{gpu}} used"),
                    Target(f"loadlens_gpu_memory_used_window_max_bytes{{{GPU}}}", "gpu {{gpu}} window peak"),
                    Target(f"loadlens_gpu_memory_reserved_bytes{{{GPU}}}", "gpu {{gpu}} driver reserved"),
                    Target(f"loadlens_gpu_memory_total_bytes{{{GPU}}}", "gpu {{gpu}} total"),
                ),
                "Device memory from NVML: used, the window's peak, the driver reservation and capacity.",
                min=0,
            ),
            Panel(
                "VRAM by owner",
                "bytes",
                (Target(f"sum by (gpu, owner) (loadlens_gpu_memory_owner_bytes{{{GPU}}})", "gpu {{gpu}} {{owner}}"),),
                "Weights, KV cache, activations, adapters, allocator slack (sim backend only: NVML cannot know).",
                stack=True,
                min=0,
            ),
            Panel(
                "VRAM by process",
                "bytes",
                (
                    Target(
                        f"sum by (gpu, pid, process_name) (loadlens_gpu_process_used_memory_bytes{{{GPU}}})",
                        "gpu {{gpu}} {{process_name}} ({{pid}})",
                    ),
                ),
                "Memory of each compute process on the GPU.",
                stack=True,
                min=0,
            ),
            Panel(
                "VRAM fluctuation",
                "percentunit",
                (Target(f"loadlens_gpu_memory_fluctuation_ratio{{{GPU}}}", "gpu {{gpu}} (max − min) / mean"),),
                f"(max − min) / mean of used VRAM in the window; line: {g['vram_fluctuation_ratio']:.0%} threshold.",
                threshold=Threshold(g["vram_fluctuation_ratio"]),
                min=0,
            ),
            Panel(
                "VRAM step increases",
                "short",
                (
                    Target(
                        f"sum by (gpu) ({increase('loadlens_gpu_memory_step_increases_total', GPU)})",
                        "gpu {{gpu}} steps",
                    ),
                ),
                "Step growths of used VRAM (adapters loading) per rate interval.",
                min=0,
            ),
            Panel(
                "Allocator fragmentation",
                "percentunit",
                (
                    Target(
                        f"loadlens_gpu_allocator_fragmentation_ratio{{{GPU}}}", "gpu {{gpu}} 1 − largest free / free"
                    ),
                ),
                f"Caching-allocator fragmentation; the line is the {g['fragmentation_ratio']:.0%} threshold.",
                threshold=Threshold(g["fragmentation_ratio"]),
                min=0,
                max=1,
            ),
            Panel(
                "Allocator memory",
                "bytes",
                (
                    Target(f"loadlens_gpu_allocator_reserved_bytes{{{GPU}}}", "gpu {{gpu}} reserved"),
                    Target(f"loadlens_gpu_allocator_allocated_bytes{{{GPU}}}", "gpu {{gpu}} allocated"),
                    Target(f"loadlens_gpu_allocator_inactive_split_bytes{{{GPU}}}", "gpu {{gpu}} inactive split"),
                    Target(
                        f"loadlens_gpu_allocator_largest_free_block_bytes{{{GPU}}}", "gpu {{gpu}} largest free block"
                    ),
                ),
                "The PyTorch caching allocator's segments, blocks handed out, split slivers and largest free block.",
                min=0,
            ),
        ),
    )
    board = Row(
        "Power, thermals, clocks, errors",
        (
            Panel(
                "Power",
                "watt",
                (
                    Target(f"loadlens_gpu_power_watts{{{GPU}}}", "gpu {{gpu}} power"),
                    Target(f"loadlens_gpu_power_limit_watts{{{GPU}}}", "gpu {{gpu}} limit"),
                    Target(
                        f"sum by (gpu) ({rate('loadlens_gpu_energy_joules_total', GPU)})", "gpu {{gpu}} from energy"
                    ),
                ),
                "Board power, the enforced cap, and the average power from the energy counter.",
                min=0,
            ),
            Panel(
                "Temperature",
                "celsius",
                (
                    Target(f"loadlens_gpu_temperature_celsius{{{GPU}}}", "gpu {{gpu}} die"),
                    Target(f"loadlens_gpu_memory_temperature_celsius{{{GPU}}}", "gpu {{gpu}} HBM"),
                ),
                "Die and memory (HBM) temperature.",
            ),
            Panel(
                "Clocks",
                "hertz",
                (
                    Target(f"loadlens_gpu_sm_clock_hz{{{GPU}}}", "gpu {{gpu}} SM"),
                    Target(f"loadlens_gpu_sm_clock_max_hz{{{GPU}}}", "gpu {{gpu}} SM max"),
                    Target(f"loadlens_gpu_memory_clock_hz{{{GPU}}}", "gpu {{gpu}} memory"),
                ),
                "Current SM and memory clocks against the SM maximum.",
            ),
            Panel(
                "Throttle reasons",
                "bool_on_off",
                (Target(f"max by (gpu, reason) (loadlens_gpu_clock_event_active{{{GPU}}})", "gpu {{gpu}} {{reason}}"),),
                "Clock event reasons holding the clocks down; hw_* means the hardware intervened.",
                kind="state-timeline",
            ),
            Panel(
                "XID errors",
                "short",
                (Target(f"sum by (gpu) ({increase('loadlens_gpu_xid_events_total', GPU)})", "gpu {{gpu}} XID"),),
                "XID critical errors per rate interval; any is worth a look (79 = fallen off the bus).",
                threshold=Threshold(1),
                min=0,
            ),
        ),
    )
    return Dashboard(
        uid="loadlens-gpu",
        title="loadlens / GPU & VRAM",
        description="Utilisation and its swing, VRAM, fragmentation, power, thermals, clocks, throttling, XID.",
        rows=(util, vram, board),
        variables=variables(f"loadlens_gpu_info{{{job_selector(GPU_JOB)}}}", gpu=True),
        annotations=(stage_annotation(), alerts_annotation()),
    )
