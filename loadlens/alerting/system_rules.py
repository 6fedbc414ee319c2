"""The alerts on the system beside the SLOs: the engine (queue, KV cache, preemptions), the GPUs, the load
generator and training.

The engine alerts read vLLM's series or, for an sglang upstream, their counterparts (``Ctx.engine``); the
alerts' labels are the same for both (``model_name``)."""

from __future__ import annotations

from typing import Any

from loadlens.alerting.rule_kit import Ctx, alert

# The vLLM series each engine alert reads; Ctx.engine adds the other dialects' counterparts.
ENGINE_ALERT_SERIES = {
    "LoadlensQueueGrowing": "vllm:num_requests_waiting",
    "LoadlensKVCacheNearFull": "vllm:kv_cache_usage_perc",
    "LoadlensPreemptionSpike": "vllm:num_preemptions_total",
}


def engine_alert_group(c: Ctx) -> dict[str, Any]:
    a = c.a
    s = c.sel("serving")
    queue_full = c.sel("serving", 'reason="queue_full"')
    series = ENGINE_ALERT_SERIES
    waiting, kv = series["LoadlensQueueGrowing"], series["LoadlensKVCacheNearFull"]
    preempted = series["LoadlensPreemptionSpike"]
    return {
        "name": "loadlens-engine",
        "rules": [
            alert(
                "LoadlensQueueGrowing",
                f"sum by (model_name) ({c.engine(waiting, lambda w: w)}) > {a['waiting_requests']:g}"
                f"\nand sum by (model_name) ({c.engine(waiting, lambda w: f'deriv({w}[2m])')}) > 0",
                "2m",
                "warning",
                "The engine's waiting queue is long and still growing.",
                "{{ $labels.model_name }} has {{ $value }} requests waiting and the queue keeps growing; "
                "the engine is past its capacity.",
            ),
            alert(
                "LoadlensKVCacheNearFull",
                f"max by (model_name) ({c.engine(kv, lambda u: u)}) > {a['kv_cache_usage_ratio']}",
                "2m",
                "warning",
                "The KV cache is nearly full.",
                "KV cache usage of {{ $labels.model_name }} is {{ $value | humanizePercentage }}; preemptions follow.",
            ),
            alert(
                "LoadlensPreemptionSpike",
                # The exposed counter ends in _total; rate(vllm:num_preemptions[...]) would match nothing.
                f"sum by (model_name) ({c.engine(preempted, lambda p: f'rate({p}[1m])')})"
                f" > {a['preemptions_per_second']:g}",
                "1m",
                "warning",
                "The engine is preempting requests.",
                "{{ $labels.model_name }} preempts {{ $value | humanize }} requests/s (recompute): KV cache pressure.",
            ),
            alert(
                "LoadlensRequestsRejected",
                f"sum by (model_name) (rate(loadlens_request_rejections_total{queue_full}[1m])) > 0",
                "1m",
                "warning",
                "Requests are being rejected because the waiting queue is full.",
                "{{ $labels.model_name }} rejects {{ $value | humanize }} requests/s with 429 (queue full).",
            ),
            alert(
                "LoadlensServingDown",
                f"up{s} == 0",
                "1m",
                "critical",
                "The serving target cannot be scraped.",
                "Prometheus cannot scrape {{ $labels.instance }} ({{ $labels.job }}) for 1m.",
            ),
        ],
    }


# Throttle reasons worth a ticket: the GPU runs below its clocks for power or heat, not by choice.
THROTTLE_REASONS = "sw_power_cap|hw_slowdown|sw_thermal_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown"


def gpu_alert_group(c: Ctx) -> dict[str, Any]:
    a, g = c.a, c.slos.gpu
    s = c.sel("gpu")
    throttled = c.sel("gpu", f'reason=~"{THROTTLE_REASONS}"')
    timeline = "loadlens_gpu_busy_swing_ratio" + c.sel("gpu", 'uuid!=""')  # a CPU process's timeline has no GPU
    rules = [
        alert(
            "LoadlensGpuUtilizationSwingHigh",
            # The busy timeline's swing (10 ms bins, issue 24 item 3) where a probe or the sim records one (the
            # largest over the GPU's processes), else NVML's coarse window (samples of ~1/6 s, blind to a 29 ms
            # swing).
            f"max by (job, instance, gpu, uuid, model) ({timeline}) > {g['util_peak_to_trough_ratio']} or "
            f"(loadlens_gpu_utilization_window_peak_to_trough_ratio{s} > {g['util_peak_to_trough_ratio']} "
            f"unless on (job, instance, uuid) {timeline})",
            "2m",
            "warning",
            "GPU utilisation swings widely.",
            "GPU {{ $labels.gpu }} ({{ $labels.model }}) swings {{ $value | humanizePercentage }} peak to trough "
            f"over the window (threshold {g['util_peak_to_trough_ratio']:.0%}; guide 2.2: 3 adapters gave 43 %).",
            component="gpu",
        ),
        alert(
            "LoadlensGpuVramFluctuationHigh",
            f"loadlens_gpu_memory_fluctuation_ratio{s} >= {g['vram_fluctuation_ratio']}",
            "1m",
            "warning",
            "GPU memory use fluctuates beyond the stability threshold.",
            "VRAM on GPU {{ $labels.gpu }} moved {{ $value | humanizePercentage }} of its mean over the window "
            f"(guide 2.3 alerts at {g['vram_fluctuation_ratio']:.0%}).",
            component="gpu",
        ),
        alert(
            "LoadlensGpuVramNearFull",
            f"loadlens_gpu_memory_used_bytes{s} / loadlens_gpu_memory_total_bytes{s} > {g['vram_used_ratio_critical']}",
            "2m",
            "critical",
            "GPU memory is nearly exhausted: out-of-memory risk.",
            "GPU {{ $labels.gpu }} uses {{ $value | humanizePercentage }} of its memory.",
            component="gpu",
        ),
        alert(
            "LoadlensGpuAllocatorFragmentationHigh",
            f"loadlens_gpu_allocator_fragmentation_ratio{s} > {g['fragmentation_ratio']}",
            "5m",
            "warning",
            "The CUDA caching allocator's free memory is fragmented.",
            "On GPU {{ $labels.gpu }}, {{ $value | humanizePercentage }} of the allocator's free memory is outside "
            "its largest free block; large allocations may fail or force cache flushes.",
            component="gpu",
        ),
        alert(
            "LoadlensGpuThrottling",
            f"max by (instance, gpu, uuid, model, reason) (loadlens_gpu_clock_event_active{throttled}) == 1",
            "2m",
            "warning",
            "The GPU is throttling its clocks.",
            "GPU {{ $labels.gpu }} holds its clocks down for {{ $labels.reason }}; throughput falls.",
            component="gpu",
        ),
        alert(
            "LoadlensGpuXidError",
            f"increase(loadlens_gpu_xid_events_total{s}[5m]) > 0",
            "0s",  # an XID is an event: page on the first one
            "critical",
            "The GPU driver reported an XID error.",
            # increase() extrapolates over the window (one event reads as 1.09); events are whole numbers.
            'GPU {{ $labels.gpu }} reported {{ printf "%.0f" $value }} XID event(s) in the last 5m; see '
            "loadlens_gpu_xid_errors_total for the codes.",
            component="gpu",
        ),
        alert(
            "LoadlensGpuLost",
            f"loadlens_gpu_device_up{s} == 0",
            "1m",
            "critical",
            "A GPU is lost or not answering NVML.",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) has not answered NVML for 1m (fallen off the bus, "
            "reset required).",
            component="gpu",
        ),
        alert(
            "LoadlensGpuExporterDown",
            f"up{s} == 0 or loadlens_gpu_nvml_up{s} == 0",
            "1m",
            "critical",
            "The GPU exporter cannot be scraped or cannot reach NVML.",
            "{{ $labels.instance }}: the GPU exporter is down or NVML does not initialise; GPU alerts are blind.",
        ),
        alert(
            "LoadlensGpuExporterStale",
            f"time() - max by (instance, collector) (loadlens_gpu_collector_last_success_timestamp_seconds{s})"
            f" > {a['gpu_exporter_stale_seconds']:g}",
            "1m",
            "warning",
            "A GPU exporter collector has not succeeded recently.",
            "Collector {{ $labels.collector }} on {{ $labels.instance }} last succeeded "
            "{{ $value | humanizeDuration }} ago.",
        ),
    ]
    return {"name": "loadlens-gpu", "rules": rules}


def loadgen_alert_group(c: Ctx) -> dict[str, Any]:
    a = c.a
    s = c.sel("loadgen")
    return {
        "name": "loadlens-loadgen",
        "rules": [
            alert(
                "LoadlensLoadgenCpuSaturated",
                f"loadlens_loadgen_cpu_ratio{s} > {a['loadgen_cpu_ratio']}",
                "30s",
                "warning",
                "The load generator is CPU-bound: its latency figures are not trustworthy.",
                "{{ $labels.instance }} uses {{ $value | humanizePercentage }} of a core; timestamps are delayed "
                "and the run's results are marked invalid. Add Locust workers.",
                component="loadgen",
            ),
            alert(
                "LoadlensFairnessIndexLow",
                f"loadlens_client_jain_fairness_index{s} < {a['fairness_index_min']}",
                "1m",
                "warning",
                "Priority classes are served unfairly.",
                'Jain\'s index over per-class normalised throughput is {{ printf "%.2f" $value }} in stage '
                f"{{{{ $labels.stage }}}} (floor {a['fairness_index_min']:g}; guide 4.3: FIFO 0.31, WFQ 0.76).",
                component="loadgen",
            ),
        ],
    }


def training_alert_group(c: Ctx) -> dict[str, Any]:
    """Guide 2.3 training-stability alerts on the series of exporters/training (docs/training.md). They select
    by series name only: a training run is scraped wherever it runs (the local stack's `loadlens-training`)."""
    t = c.slos.training
    vram = c.slos.gpu["vram_fluctuation_ratio"]
    return {
        "name": "loadlens-training",
        "rules": [
            alert(
                "LoadlensTrainingGradNormJump",
                # The exporter counts every step whose norm exceeds the factor x the EMA before it, so a one-step
                # spike between two scrapes still pages (a gauge comparison would only see the scraped step).
                "increase(loadlens_training_grad_norm_jumps_total[1m]) > 0",
                "0s",  # one step's jump is the event the guide alerts on
                "warning",
                "The gradient norm jumped far above its moving average.",
                'Run {{ $labels.run }}: {{ printf "%.0f" $value }} step(s) in the last 1m had a gradient L2 norm '
                f"above {t['grad_norm_jump_factor']:g}x its EMA (guide 2.3).",
                component="training",
            ),
            alert(
                "LoadlensTrainingVramPeakFluctuation",
                f"loadlens_training_vram_peak_fluctuation_ratio >= {vram}",
                "0s",
                "warning",
                "Peak GPU memory between training steps fluctuates beyond the stability threshold.",
                "Run {{ $labels.run }}: peak VRAM moved {{ $value | humanizePercentage }} between steps "
                f"(guide 2.3 alerts at {vram:.0%}).",
                component="training",
            ),
            alert(
                "LoadlensTrainingLoraUpdateCorrelationLow",
                f"loadlens_training_lora_ab_correlation < {t['lora_ab_correlation_min']:g}",
                "1m",  # Adam's first steps are less coherent; a sustained drop is the signal
                "warning",
                "A LoRA module's updates lost their step-to-step coherence.",
                'Run {{ $labels.run }}, module {{ $labels.module }}: update correlation {{ printf "%.3f" $value }} '
                f"below {t['lora_ab_correlation_min']:g} for 1m (guide 2.3).",
                component="training",
            ),
        ],
    }
