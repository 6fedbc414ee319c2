"""Prometheus recording and alerting rules, built from the SLO file (one source of truth).

Conventions (kubernetes-mixin / node-mixin style):
- recording rules are named ``level:metric:operations`` with the window in the name; ``_total`` is dropped
  under ``rate()``;
- SLO series follow sloth's names (``slo:sli_error:ratio_rate5m`` ... with ``sloth_id``, ``sloth_service``,
  ``sloth_slo``, ``sloth_window`` labels; ``slo:objective:ratio``, ``slo:error_budget:ratio``) so sloth's
  dashboards read them;
- every alert is CamelCase with the ``Loadlens`` prefix, has ``for``, ``severity`` (``critical`` pages,
  ``warning`` opens a ticket), a static ``summary`` ending with a period, a templated ``description`` and a
  ``runbook_url`` to ``docs/runbooks.md#<alertname lower-cased>`` (added to all by one function).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client.utils import floatToGoString

from loadlens.contracts.ports import SERVE_JOB
from loadlens.contracts.slo import PriorityClass, SLOConfig

# Multi-window multi-burn-rate table for a 30-day budget (SRE Workbook; the 1d/2h row as sloth/k8s-mixin).
BURN_WINDOWS: tuple[tuple[str, str, str, float, str], ...] = (
    # severity, long, short, factor, for
    ("critical", "1h", "5m", 14.4, "2m"),
    ("critical", "6h", "30m", 6.0, "15m"),
    ("warning", "1d", "2h", 3.0, "1h"),
    ("warning", "3d", "6h", 1.0, "3h"),
)
SLI_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
SERVICE = SERVE_JOB  # sloth_service: the service whose SLOs these are


@dataclass(frozen=True)
class Ctx:
    slos: SLOConfig
    a: dict[str, Any]

    def sel(self, name: str, extra: str = "") -> str:
        base = self.a["selectors"][name]
        return "{" + ",".join(x for x in (base, extra) if x) + "}"


def le(value: float) -> str:
    """The ``le`` label value prometheus_client writes for a boundary (e.g. 0.2 -> "0.2", 20 -> "20.0")."""
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def _alert(
    name: str, expr: str, for_: str, severity: str, summary: str, description: str, **labels: str
) -> dict[str, Any]:
    assert summary.endswith("."), name
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, **labels},
        "annotations": {"summary": summary, "description": description},
    }


def add_runbook_links(groups: list[dict[str, Any]], base: str) -> list[dict[str, Any]]:
    for group in groups:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["annotations"]["runbook_url"] = f"{base}#{rule['alert'].lower()}"
    return groups


# --- SLO recording rules ------------------------------------------------------------------------------


def _ttft_sli(c: Ctx, cls: PriorityClass, window: str) -> str:
    s = c.sel("serving", f'priority_class="{cls.name}"')
    good = c.sel("serving", f'priority_class="{cls.name}",le="{le(cls.ttft_seconds)}"')
    return (
        f"1 - (sum by (gen_ai_request_model) (rate(gen_ai_server_time_to_first_token_seconds_bucket{good}[{window}]))"
        f" / sum by (gen_ai_request_model) (rate(gen_ai_server_time_to_first_token_seconds_count{s}[{window}])))"
    )


def _error_sli(c: Ctx, window: str) -> str:
    s = c.sel("serving")
    bad = c.sel("serving", 'code=~"5..|429"')
    return (
        f"sum by (model_name) (rate(loadlens_requests_total{bad}[{window}]))"
        f" / sum by (model_name) (rate(loadlens_requests_total{s}[{window}]))"
    )


def slo_recording_groups(c: Ctx) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for cls in c.slos.classes:
        slo = f"ttft-{cls.name}"
        labels = {"sloth_service": SERVICE, "sloth_slo": slo, "sloth_id": f"{SERVICE}-{slo}"}
        rules: list[dict[str, Any]] = [
            {
                "record": f"slo:sli_error:ratio_rate{w}",
                "expr": _ttft_sli(c, cls, w),
                "labels": {**labels, "sloth_window": w},
            }
            for w in SLI_WINDOWS
        ]
        rules += [
            {"record": "slo:objective:ratio", "expr": f"vector({cls.objective_ratio})", "labels": labels},
            {"record": "slo:error_budget:ratio", "expr": f"vector({1 - cls.objective_ratio:.6g})", "labels": labels},
        ]
        groups.append({"name": f"loadlens-slo-{slo}", "rules": rules})
    labels = {"sloth_service": SERVICE, "sloth_slo": "availability", "sloth_id": f"{SERVICE}-availability"}
    objective = c.slos.availability_objective_ratio
    rules = [
        {"record": f"slo:sli_error:ratio_rate{w}", "expr": _error_sli(c, w), "labels": {**labels, "sloth_window": w}}
        for w in SLI_WINDOWS
    ]
    rules += [
        {"record": "slo:objective:ratio", "expr": f"vector({objective})", "labels": labels},
        {"record": "slo:error_budget:ratio", "expr": f"vector({1 - objective:.6g})", "labels": labels},
    ]
    groups.append({"name": "loadlens-slo-availability", "rules": rules})
    return groups


def serving_recording_group(c: Ctx) -> dict[str, Any]:
    w = c.a["latency_window"]
    s = c.sel("serving")
    by = "gen_ai_request_model, priority_class"
    rules = [
        {
            "record": f"gen_ai_request_model_priority_class:gen_ai_server_time_to_first_token_seconds:p99_rate{w}",
            "expr": f"histogram_quantile(0.99, sum by (le, {by}) "
            f"(rate(gen_ai_server_time_to_first_token_seconds_bucket{s}[{w}])))",
        },
        {
            "record": f"model_name_priority_class:loadlens_inter_token_latency_seconds:p99_rate{w}",
            "expr": "histogram_quantile(0.99, sum by (le, model_name, priority_class) "
            f"(rate(loadlens_inter_token_latency_seconds_bucket{s}[{w}])))",
        },
        {
            "record": f"gen_ai_request_model_priority_class:gen_ai_server_request:rate{w}",
            "expr": f"sum by ({by}) (rate(gen_ai_server_time_to_first_token_seconds_count{s}[{w}]))",
        },
        {
            "record": "model_name:loadlens_requests:rate5m",
            "expr": f"sum by (model_name) (rate(loadlens_requests_total{s}[5m]))",
        },
        {
            "record": "model_name:loadlens_requests_errors:ratio_rate5m",
            "expr": _error_sli(c, "5m"),
        },
        {
            "record": "model_name_priority_class:loadlens_goodput:ratio_rate5m",
            "expr": f"sum by (model_name, priority_class) (rate(loadlens_goodput_requests_total{s}[5m]))"
            f" / sum by (model_name, priority_class) (rate(loadlens_slo_eligible_requests_total{s}[5m]))",
        },
        {
            "record": "model_name:loadlens_lora_swap_delayed:ratio_rate5m",
            "expr": f"sum by (model_name) (rate(loadlens_lora_swap_delayed_requests_total{s}[5m]))"
            f" / sum by (model_name) (rate(loadlens_slo_eligible_requests_total{s}[5m]))",
        },
    ]
    return {"name": "loadlens-serving-recording", "rules": rules}


# --- alerts -------------------------------------------------------------------------------------------


def slo_alert_group(c: Ctx) -> dict[str, Any]:
    a = c.a
    w = a["latency_window"]
    rules: list[dict[str, Any]] = []
    min_rate = a["min_request_rate"]
    for cls in c.slos.classes:
        in_class = c.sel("serving", f'priority_class="{cls.name}"')
        traffic = (
            f'gen_ai_request_model_priority_class:gen_ai_server_request:rate{w}{{priority_class="{cls.name}"}}'
            f" > {min_rate}"
        )
        rules.append(
            _alert(
                "LoadlensTTFTP99High",
                f"gen_ai_request_model_priority_class:gen_ai_server_time_to_first_token_seconds:p99_rate{w}"
                f'{{priority_class="{cls.name}"}} > {cls.ttft_seconds} and on (gen_ai_request_model, priority_class) '
                f"({traffic})",
                a["latency_for"],
                "critical",
                "Time to first token p99 is over its SLO.",
                f"TTFT p99 of {{{{ $labels.gen_ai_request_model }}}} ({cls.name}) is "
                f"{{{{ $value | humanizeDuration }}}} over {w}, above the {cls.ttft_seconds:g} s SLO.",
                slo="ttft",
                priority_class=cls.name,
            )
        )
        rules.append(
            _alert(
                "LoadlensITLP99High",
                f"model_name_priority_class:loadlens_inter_token_latency_seconds:p99_rate{w}"
                f'{{priority_class="{cls.name}"}} > {cls.itl_seconds} and on (model_name, priority_class) '
                f"(sum by (model_name, priority_class) (rate(loadlens_slo_eligible_requests_total{in_class}[{w}]))"
                f" > {min_rate})",
                a["latency_for"],
                "critical",
                "Inter-token latency p99 is over its SLO.",
                f"ITL p99 of {{{{ $labels.model_name }}}} ({cls.name}) is {{{{ $value | humanizeDuration }}}} "
                f"over {w}, above the {cls.itl_seconds:g} s SLO.",
                slo="itl",
                priority_class=cls.name,
            )
        )
    s = c.sel("serving")
    rules.append(
        _alert(
            "LoadlensErrorRatioHigh",
            f"model_name:loadlens_requests_errors:ratio_rate5m > {a['error_ratio']}"
            f" and on (model_name) model_name:loadlens_requests:rate5m > {min_rate}",
            "2m",
            "critical",
            "Too many requests fail with a server error or are rejected.",
            "{{ $value | humanizePercentage }} of requests to {{ $labels.model_name }} failed (5xx) or were "
            f"rejected (429) over 5m; the threshold is {a['error_ratio']:.0%}.",
            slo="availability",
        )
    )
    rules.append(
        _alert(
            "LoadlensGoodputLow",
            f"model_name_priority_class:loadlens_goodput:ratio_rate5m < {a['goodput_ratio_min']}"
            f" and on (model_name, priority_class) sum by (model_name, priority_class)"
            f" (rate(loadlens_slo_eligible_requests_total{s}[5m])) > {min_rate}",
            "2m",
            "warning",
            "Too few requests meet all of their SLOs (goodput dropped).",
            "Only {{ $value | humanizePercentage }} of {{ $labels.priority_class }} requests to "
            "{{ $labels.model_name }} met every SLO over 5m; the floor is "
            f"{a['goodput_ratio_min']:.0%}.",
            slo="goodput",
        )
    )
    swap = c.slos.lora_swap
    rules.append(
        _alert(
            "LoadlensLoraSwapSLABreached",
            f"model_name:loadlens_lora_swap_delayed:ratio_rate5m > {swap.max_delayed_ratio}",
            "2m",
            "critical",
            "Too many requests are delayed by LoRA adapter hot swaps.",
            "{{ $value | humanizePercentage }} of requests to {{ $labels.model_name }} waited more than "
            f"{swap.delay_seconds * 1000:g} ms behind adapter loads over 5m; the SLA allows "
            f"{swap.max_delayed_ratio:.1%}.",
            slo="lora_swap",
        )
    )
    return {"name": "loadlens-slo-alerts", "rules": rules}


def burn_rate_group(c: Ctx) -> dict[str, Any]:
    rules = []
    slos = [
        (f"ttft-{cls.name}", "LoadlensTTFTErrorBudgetBurn", "time to first token", 1 - cls.objective_ratio)
        for cls in c.slos.classes
    ]
    slos.append(("availability", "LoadlensErrorBudgetBurn", "availability", 1 - c.slos.availability_objective_ratio))
    for slo, alertname, what, budget in slos:
        sid = f'sloth_id="{SERVICE}-{slo}", sloth_service="{SERVICE}", sloth_slo="{slo}"'
        for severity in ("critical", "warning"):
            rows = [r for r in BURN_WINDOWS if r[0] == severity]
            parts = []
            for _, long_w, short_w, factor, _ in rows:
                limit = f"{factor * budget:.6g}"  # factor x error budget, as sloth writes it
                parts.append(
                    f"(max(slo:sli_error:ratio_rate{long_w}{{{sid}}} > {limit}) without (sloth_window)"
                    f" and max(slo:sli_error:ratio_rate{short_w}{{{sid}}} > {limit}) without (sloth_window))"
                )
            windows = " or ".join(f"{r[1]}/{r[2]} at {r[3]:g}x" for r in rows)
            rules.append(
                _alert(
                    alertname,
                    "\nor ".join(parts),
                    rows[0][4],
                    severity,
                    f"The {what} SLO is burning its error budget too fast.",
                    f"{{{{ $labels.sloth_slo }}}} error ratio is {{{{ $value | humanizePercentage }}}} over both "
                    f"windows of one of: {windows} the budget rate (30-day budget {budget:.3g}).",
                    slo=slo,
                    sloth_severity="page" if severity == "critical" else "ticket",
                )
            )
    return {"name": "loadlens-slo-burn-rate", "rules": rules}


def engine_alert_group(c: Ctx) -> dict[str, Any]:
    a = c.a
    s = c.sel("serving")
    queue_full = c.sel("serving", 'reason="queue_full"')
    return {
        "name": "loadlens-engine",
        "rules": [
            _alert(
                "LoadlensQueueGrowing",
                f"sum by (model_name) (vllm:num_requests_waiting{s}) > {a['waiting_requests']:g}"
                f" and sum by (model_name) (deriv(vllm:num_requests_waiting{s}[2m])) > 0",
                "2m",
                "warning",
                "The engine's waiting queue is long and still growing.",
                "{{ $labels.model_name }} has {{ $value }} requests waiting and the queue keeps growing; "
                "the engine is past its capacity.",
            ),
            _alert(
                "LoadlensKVCacheNearFull",
                f"max by (model_name) (vllm:kv_cache_usage_perc{s}) > {a['kv_cache_usage_ratio']}",
                "2m",
                "warning",
                "The KV cache is nearly full.",
                "KV cache usage of {{ $labels.model_name }} is {{ $value | humanizePercentage }}; preemptions follow.",
            ),
            _alert(
                "LoadlensPreemptionSpike",
                # The exposed counter ends in _total; rate(vllm:num_preemptions[...]) would match nothing.
                f"sum by (model_name) (rate(vllm:num_preemptions_total{s}[1m])) > {a['preemptions_per_second']:g}",
                "1m",
                "warning",
                "The engine is preempting requests.",
                "{{ $labels.model_name }} preempts {{ $value | humanize }} requests/s (recompute): KV cache pressure.",
            ),
            _alert(
                "LoadlensRequestsRejected",
                f"sum by (model_name) (rate(loadlens_request_rejections_total{queue_full}[1m])) > 0",
                "1m",
                "warning",
                "Requests are being rejected because the waiting queue is full.",
                "{{ $labels.model_name }} rejects {{ $value | humanize }} requests/s with 429 (queue full).",
            ),
            _alert(
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
    rules = [
        _alert(
            "LoadlensGpuUtilizationSwingHigh",
            f"loadlens_gpu_utilization_window_peak_to_trough_ratio{s} > {g['util_peak_to_trough_ratio']}",
            "2m",
            "warning",
            "GPU utilisation swings widely.",
            "GPU {{ $labels.gpu }} ({{ $labels.model }}) swings {{ $value | humanizePercentage }} peak to trough "
            f"over the window (threshold {g['util_peak_to_trough_ratio']:.0%}; guide 2.2: 3 adapters gave 43 %).",
            component="gpu",
        ),
        _alert(
            "LoadlensGpuVramFluctuationHigh",
            f"loadlens_gpu_memory_fluctuation_ratio{s} >= {g['vram_fluctuation_ratio']}",
            "1m",
            "warning",
            "GPU memory use fluctuates beyond the stability threshold.",
            "VRAM on GPU {{ $labels.gpu }} moved {{ $value | humanizePercentage }} of its mean over the window "
            f"(guide 2.3 alerts at {g['vram_fluctuation_ratio']:.0%}).",
            component="gpu",
        ),
        _alert(
            "LoadlensGpuVramNearFull",
            f"loadlens_gpu_memory_used_bytes{s} / loadlens_gpu_memory_total_bytes{s} > {g['vram_used_ratio_critical']}",
            "2m",
            "critical",
            "GPU memory is nearly exhausted: out-of-memory risk.",
            "GPU {{ $labels.gpu }} uses {{ $value | humanizePercentage }} of its memory.",
            component="gpu",
        ),
        _alert(
            "LoadlensGpuAllocatorFragmentationHigh",
            f"loadlens_gpu_allocator_fragmentation_ratio{s} > {g['fragmentation_ratio']}",
            "5m",
            "warning",
            "The CUDA caching allocator's free memory is fragmented.",
            "On GPU {{ $labels.gpu }}, {{ $value | humanizePercentage }} of the allocator's free memory is outside "
            "its largest free block; large allocations may fail or force cache flushes.",
            component="gpu",
        ),
        _alert(
            "LoadlensGpuThrottling",
            f"max by (instance, gpu, uuid, model, reason) (loadlens_gpu_clock_event_active{throttled}) == 1",
            "2m",
            "warning",
            "The GPU is throttling its clocks.",
            "GPU {{ $labels.gpu }} holds its clocks down for {{ $labels.reason }}; throughput falls.",
            component="gpu",
        ),
        _alert(
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
        _alert(
            "LoadlensGpuLost",
            f"loadlens_gpu_device_up{s} == 0",
            "1m",
            "critical",
            "A GPU is lost or not answering NVML.",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) has not answered NVML for 1m (fallen off the bus, "
            "reset required).",
            component="gpu",
        ),
        _alert(
            "LoadlensGpuExporterDown",
            f"up{s} == 0 or loadlens_gpu_nvml_up{s} == 0",
            "1m",
            "critical",
            "The GPU exporter cannot be scraped or cannot reach NVML.",
            "{{ $labels.instance }}: the GPU exporter is down or NVML does not initialise; GPU alerts are blind.",
        ),
        _alert(
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
            _alert(
                "LoadlensLoadgenCpuSaturated",
                f"loadlens_loadgen_cpu_ratio{s} > {a['loadgen_cpu_ratio']}",
                "30s",
                "warning",
                "The load generator is CPU-bound: its latency figures are not trustworthy.",
                "{{ $labels.instance }} uses {{ $value | humanizePercentage }} of a core; timestamps are delayed "
                "and the run's results are marked invalid. Add Locust workers.",
                component="loadgen",
            ),
            _alert(
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
    """Guide 2.3 training-stability alerts. The series come with the training callback (later issue); their
    names are fixed here and in docs/metrics.md so dashboards and rules can be written once."""
    t = c.slos.training
    return {
        "name": "loadlens-training",
        "rules": [
            _alert(
                "LoadlensTrainingGradNormJump",
                f"loadlens_training_grad_norm > {t['grad_norm_jump_factor']:g} * loadlens_training_grad_norm_ema",
                "0s",  # one step's jump is the event the guide alerts on
                "warning",
                "The gradient norm jumped far above its moving average.",
                "Run {{ $labels.run }}: gradient L2 norm {{ $value | humanize }} exceeds "
                f"{t['grad_norm_jump_factor']:g}x its EMA (guide 2.3).",
                component="training",
            ),
            _alert(
                "LoadlensTrainingVramPeakFluctuation",
                f"loadlens_training_vram_peak_fluctuation_ratio >= {c.slos.gpu['vram_fluctuation_ratio']}",
                "0s",
                "warning",
                "Peak GPU memory between training steps fluctuates beyond the stability threshold.",
                "Run {{ $labels.run }}: peak VRAM moved {{ $value | humanizePercentage }} between steps "
                f"(guide 2.3 alerts at {c.slos.gpu['vram_fluctuation_ratio']:.0%}).",
                component="training",
            ),
        ],
    }


def build_groups(slos: SLOConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(recording groups, alerting groups)."""
    c = Ctx(slos, slos.alerting)
    recording = [serving_recording_group(c), *slo_recording_groups(c)]
    alerts = [
        slo_alert_group(c),
        burn_rate_group(c),
        engine_alert_group(c),
        gpu_alert_group(c),
        loadgen_alert_group(c),
        training_alert_group(c),
    ]
    return recording, add_runbook_links(alerts, c.a["runbook_base_url"])
