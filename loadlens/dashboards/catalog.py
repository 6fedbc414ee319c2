"""The loadlens dashboards: load test overview, GPU & VRAM, serving engine.

Metric names come from the exporters (exporters/serving/metrics.py, exporters/serving/engines/sim/,
exporters/gpu/collectors/, loadgen/metrics.py); tests/dashboards proves every query returns data against a
live sim run. Thresholds come from the SLO file, so `make generate` keeps the lines in step with it.
"""

from __future__ import annotations

from pathlib import Path

from loadlens.contracts.ports import GPU_JOB, LOADGEN_JOB, SERVE_JOB, job_selector
from loadlens.contracts.slo import SLOConfig, load_slos
from loadlens.dashboards.model import (
    Annotation,
    Dashboard,
    Panel,
    Row,
    Target,
    Threshold,
    Variable,
    increase,
    mean,
    quantile,
    rate,
)

# Selectors. Server-side series carry the vLLM-style `model_name` (gen_ai_* carry `gen_ai_request_model`);
# load-generator series carry `stage`; GPU series carry `gpu`. `$instance` narrows to one scrape target of
# the dashboard's own job; the load generator is its own job, so its selectors leave `instance` alone.
SERVE = f'{job_selector(SERVE_JOB)}, model_name=~"$model", instance=~"$instance"'
SERVE_ANY = f'{job_selector(SERVE_JOB)}, instance=~"$instance"'
GENAI = f'{job_selector(SERVE_JOB)}, gen_ai_request_model=~"$model", instance=~"$instance"'
CLIENT = f'{job_selector(LOADGEN_JOB)}, model_name=~"$model", stage=~"$stage"'
LOADGEN = job_selector(LOADGEN_JOB)
GPU_ON_INSTANCE = f'{job_selector(GPU_JOB)}, instance=~"$instance"'
GPU = f'{GPU_ON_INSTANCE}, gpu=~"$gpu"'
LOADGEN_STAGE = LOADGEN + ', stage=~"$stage"'
CLIENT_FAILED = CLIENT + ', outcome!="success"'
ENGINE_FAILED = SERVE + ', finished_reason=~"abort|error"'
SLO_LEGEND = "SLO {{priority_class}}"
SLO_DASHED = "^SLO .*"


def _slo_line(slo: str) -> Target:
    return Target(f'max by (priority_class) (loadlens_slo_threshold_seconds{{slo="{slo}"}})', SLO_LEGEND)


def _stage_annotation() -> Annotation:
    # One region per stage: the series is 1 while its stage runs, so each change of stage starts a new one.
    return Annotation("Stage", f"max by (stage) (loadlens_loadgen_stage{{{LOADGEN}}}) == 1", "stage {{stage}}", "blue")


def _alerts_annotation() -> Annotation:
    return Annotation(
        "Firing alerts",
        'ALERTS{alertstate="firing"}',
        "{{alertname}}",
        "red",
        text="{{severity}} {{job}}",
    )


def _variables(instance_metric: str, *, gpu: bool = False) -> tuple[Variable, ...]:
    out = [
        Variable("model", "Model", f"label_values(loadlens_requests_total{{{job_selector(SERVE_JOB)}}}, model_name)"),
        Variable("instance", "Instance", f"label_values({instance_metric}, instance)"),
        Variable("stage", "Stage", f"label_values(loadlens_loadgen_stage{{{LOADGEN}}}, stage)"),
    ]
    if gpu:
        out.append(
            Variable(
                "gpu", "GPU", f'label_values(loadlens_gpu_info{{{job_selector(GPU_JOB)}, instance=~"$instance"}}, gpu)'
            )
        )
    return tuple(out)


def _latency(title: str, histogram: str, selector: str, slo: str, description: str) -> Panel:
    return Panel(
        title,
        "s",
        (
            Target(quantile(0.5, histogram, selector), "p50"),
            Target(quantile(0.95, histogram, selector), "p95"),
            Target(quantile(0.99, histogram, selector), "p99"),
            Target(mean(histogram, selector), "mean"),
            _slo_line(slo),
        ),
        description,
        dashed=SLO_DASHED,
    )


def overview() -> Dashboard:
    load = Row(
        "Load",
        (
            Panel(
                "Stage",
                "bool_on_off",
                (Target(f'max by (stage) (loadlens_loadgen_stage{{{LOADGEN}, stage=~"$stage"}})', "{{stage}}"),),
                "The load profile's stage that is running (1) — the stage annotations mark the same bands.",
                kind="state-timeline",
                height=5,
                width=24,
            ),
            Panel(
                "Users",
                "short",
                (
                    Target(f"max(loadlens_loadgen_users{{{LOADGEN}}})", "users running"),
                    Target(f"max(loadlens_loadgen_target_users{{{LOADGEN}}})", "target users"),
                    Target(f"sum(loadlens_loadgen_in_flight_requests{{{LOADGEN}}})", "in flight (client)"),
                ),
                "Locust users running, what the stage asks for, and requests the client has in flight.",
            ),
            Panel(
                "Requests per second",
                "reqps",
                (
                    Target(
                        f"sum by (outcome) ({rate('loadlens_client_requests_total', CLIENT)})", "client {{outcome}}"
                    ),
                    Target(f"sum by (code) ({rate('loadlens_requests_total', SERVE)})", "server {{code}}"),
                ),
                "Finished requests: client side by outcome, server side by HTTP status code.",
            ),
        ),
    )
    latency = Row(
        "Latency against the SLOs",
        (
            _latency(
                "TTFT (server)",
                "gen_ai_server_time_to_first_token_seconds",
                GENAI,
                "ttft",
                "Arrival to first output token sent; dashed: the TTFT SLO of each priority class.",
            ),
            _latency(
                "ITL (server)",
                "loadlens_inter_token_latency_seconds",
                SERVE,
                "itl",
                "Gap between consecutive streamed output events; dashed: the ITL SLO (judged on TPOT).",
            ),
            _latency(
                "E2E latency (server)",
                "gen_ai_server_request_duration_seconds",
                GENAI + ', error_type=""',
                "e2e",
                "Arrival to last byte of successful requests; dashed: the E2E SLO.",
            ),
            Panel(
                "TTFT: client vs server",
                "s",
                (
                    Target(quantile(0.5, "loadlens_client_time_to_first_token_seconds", CLIENT), "client p50"),
                    Target(quantile(0.99, "loadlens_client_time_to_first_token_seconds", CLIENT), "client p99"),
                    Target(quantile(0.5, "gen_ai_server_time_to_first_token_seconds", GENAI), "server p50"),
                    Target(quantile(0.99, "gen_ai_server_time_to_first_token_seconds", GENAI), "server p99"),
                    _slo_line("ttft"),
                ),
                "The gap between the two is network, client and HTTP-stack time the server cannot see.",
                dashed=SLO_DASHED,
            ),
        ),
    )
    throughput = Row(
        "Throughput and SLO attainment",
        (
            Panel(
                "Output tokens per second",
                "suffix:tok/s",
                (
                    Target(f"sum({rate('loadlens_output_tokens_total', SERVE)})", "server"),
                    Target(
                        f"sum({rate('loadlens_client_streamed_tokens_total', LOADGEN_STAGE)})",
                        "client (streamed)",
                    ),
                ),
                "Output tokens as they stream, counted by the server and by the load generator.",
            ),
            Panel(
                "Goodput",
                "reqps",
                (
                    Target(
                        f"sum by (priority_class) ({rate('loadlens_goodput_requests_total', SERVE)})",
                        "server {{priority_class}}",
                    ),
                    Target(
                        f"sum by (priority_class) ({rate('loadlens_client_goodput_requests_total', CLIENT)})",
                        "client {{priority_class}}",
                    ),
                ),
                "Successful requests that met every SLO of their priority class, per second.",
            ),
            Panel(
                "Goodput ratio",
                "percentunit",
                (
                    Target(
                        f"sum by (priority_class) ({rate('loadlens_goodput_requests_total', SERVE)})"
                        f" / sum by (priority_class) ({rate('loadlens_slo_eligible_requests_total', SERVE)})",
                        "{{priority_class}}",
                    ),
                ),
                "Share of successful requests that met every SLO; the objective is the class's objective ratio.",
                min=0,
                max=1,
            ),
            Panel(
                "SLA breaches",
                "reqps",
                (
                    Target(
                        f"sum by (priority_class, slo) ({rate('loadlens_sla_breaches_total', SERVE)})",
                        "{{priority_class}} {{slo}}",
                    ),
                ),
                "Successful requests that missed one SLO (ttft, itl, e2e), per second.",
            ),
        ),
    )
    errors = Row(
        "Errors and alerts",
        (
            Panel(
                "Errors by reason",
                "reqps",
                (
                    Target(
                        f"sum by (reason) ({rate('loadlens_request_rejections_total', SERVE)})", "rejected {{reason}}"
                    ),
                    Target(f"sum by (reason) ({rate('loadlens_request_aborts_total', SERVE)})", "aborted {{reason}}"),
                    Target(
                        f"sum by (outcome) ({rate('loadlens_client_requests_total', CLIENT_FAILED)})",
                        "client {{outcome}}",
                    ),
                ),
                "Requests refused before generation, ended after admission, and failed client-side outcomes.",
            ),
            Panel(
                "Alerts firing",
                "short",
                (Target('count(ALERTS{alertstate="firing"}) or vector(0)', "firing"),),
                "Prometheus alerts in the firing state (0 when none); the red annotations name them.",
                kind="stat",
                threshold=Threshold(1),
            ),
        ),
    )
    return Dashboard(
        uid="loadlens-overview",
        title="loadlens / Load test overview",
        description="Stages, request rate, latency against the SLOs, throughput, goodput and errors of a load test.",
        rows=(load, latency, throughput, errors),
        variables=_variables(f"loadlens_build_info{{{job_selector(SERVE_JOB)}}}"),
        annotations=(_stage_annotation(), _alerts_annotation()),
    )


def gpu(slos: SLOConfig) -> Dashboard:
    g = slos.gpu
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
                ),
                f"Utilisation peak-to-trough over the window; line: {g['util_peak_to_trough_ratio']:.0%} threshold.",
                threshold=Threshold(g["util_peak_to_trough_ratio"]),
                min=0,
            ),
            Panel(
                "Utilisation swing period",
                "s",
                (
                    Target(f"loadlens_gpu_utilization_swing_period_seconds{{{GPU}}}", "gpu {{gpu}} period"),
                    Target(f"loadlens_gpu_utilization_sample_interval_seconds{{{GPU}}}", "gpu {{gpu}} sample interval"),
                ),
                "Dominant period of the swing (absent when flat); periods under 2× the sample interval are invisible.",
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
        variables=_variables(f"loadlens_gpu_info{{{job_selector(GPU_JOB)}}}", gpu=True),
        annotations=(_stage_annotation(), _alerts_annotation()),
    )


def serving(slos: SLOConfig) -> Dashboard:
    sched = Row(
        "Scheduler",
        (
            Panel(
                "Running / waiting",
                "short",
                (
                    Target(f"sum(vllm:num_requests_running{{{SERVE}}})", "running"),
                    Target(f"sum(vllm:num_requests_waiting{{{SERVE}}})", "waiting"),
                    Target(f"sum by (reason) (vllm:num_requests_waiting_by_reason{{{SERVE}}})", "waiting: {{reason}}"),
                    Target(f"sum(loadlens_requests_in_flight{{{SERVE}}})", "in flight (serving layer)"),
                ),
                "Requests in the engine's batch, waiting for it (capacity or deferred for LoRA slots), and admitted.",
                min=0,
            ),
            Panel(
                "KV cache usage",
                "percentunit",
                (Target(f"max(vllm:kv_cache_usage_perc{{{SERVE}}})", "KV cache used"),),
                "Referenced KV blocks / all blocks.",
                threshold=Threshold(slos.alerting["kv_cache_usage_ratio"]),
                min=0,
                max=1,
            ),
            Panel(
                "Batch size (iteration tokens)",
                "short",
                (
                    Target(quantile(0.5, "vllm:iteration_tokens_total", SERVE), "p50"),
                    Target(quantile(0.99, "vllm:iteration_tokens_total", SERVE), "p99"),
                    Target(mean("vllm:iteration_tokens_total", SERVE), "mean"),
                ),
                "Tokens per engine step (prompt tokens of requests reaching their first token + generated tokens).",
                min=0,
            ),
            Panel(
                "Preemptions",
                "ops",
                (Target(f"sum({rate('vllm:num_preemptions_total', SERVE)})", "preemptions/s"),),
                "Requests preempted (KV cache pressure) per second; they recompute later.",
                min=0,
            ),
        ),
    )
    phases = Row(
        "Request phases",
        tuple(
            Panel(
                f"{name} time",
                "s",
                (
                    Target(quantile(0.5, f"vllm:request_{metric}_time_seconds", SERVE), "p50"),
                    Target(quantile(0.99, f"vllm:request_{metric}_time_seconds", SERVE), "p99"),
                    Target(mean(f"vllm:request_{metric}_time_seconds", SERVE), "mean"),
                ),
                what,
                width=8,
            )
            for name, metric, what in (
                ("Queue", "queue", "Queued until first scheduled."),
                ("Prefill", "prefill", "First scheduled until first token."),
                ("Decode", "decode", "First token until last token."),
            )
        ),
    )
    classes = Row(
        "Priority classes and fairness",
        (
            Panel(
                "Requests by priority class",
                "reqps",
                (Target(f"sum by (priority_class) ({rate('loadlens_requests_total', SERVE)})", "{{priority_class}}"),),
                "Finished requests per second by priority class.",
                stack=True,
                width=8,
            ),
            Panel(
                "TTFT p99 by priority class",
                "s",
                (
                    Target(
                        quantile(0.99, "gen_ai_server_time_to_first_token_seconds", GENAI, by="priority_class"),
                        "{{priority_class}} p99",
                    ),
                    _slo_line("ttft"),
                ),
                "Each class against its own TTFT SLO (dashed).",
                dashed=SLO_DASHED,
                width=8,
            ),
            Panel(
                "Fairness (Jain's index)",
                "percentunit",
                (
                    Target(
                        f'max by (stage) (loadlens_client_jain_fairness_index{{{LOADGEN}, stage=~"$stage"}})',
                        "{{stage}}",
                    ),
                ),
                f"Jain's index across priority classes (1 = fair; alert below {slos.alerting['fairness_index_min']}).",
                threshold=Threshold(slos.alerting["fairness_index_min"], color="green"),
                min=0,
                max=1,
                width=8,
            ),
        ),
    )
    lora = Row(
        "LoRA adapters",
        (
            Panel(
                "Adapters loaded",
                "short",
                (
                    Target(
                        "count by (running_lora_adapters, waiting_lora_adapters, max_lora)"
                        f" (vllm:lora_requests_info{{{SERVE_ANY}}})",
                        "running: {{running_lora_adapters}} waiting: {{waiting_lora_adapters}} (max {{max_lora}})",
                    ),
                    Target(
                        "sum by (operation, outcome)"
                        f" ({increase('loadlens_lora_adapter_operations_total', SERVE_ANY)})",
                        "{{operation}} {{outcome}}",
                    ),
                ),
                "Adapters the engine runs and waits for (in the legend), and runtime load/unload calls per interval.",
                min=0,
            ),
            Panel(
                "Swap blocking",
                "s",
                (
                    Target(quantile(0.99, "loadlens_lora_swap_blocking_seconds", SERVE), "blocked p99"),
                    Target(mean("loadlens_lora_swap_blocking_seconds", SERVE), "blocked mean"),
                    Target(
                        'max(loadlens_slo_threshold_seconds{priority_class="all", slo="lora_swap_delay"})',
                        "SLO swap delay",
                    ),
                ),
                "Per request, time blocked behind adapter loads; dashed: the hot-swap delay SLO.",
                dashed=SLO_DASHED,
            ),
            Panel(
                "Requests delayed by swaps",
                "percentunit",
                (
                    Target(
                        f"sum({rate('loadlens_lora_swap_delayed_requests_total', SERVE)})"
                        f" / sum({rate('loadlens_slo_eligible_requests_total', SERVE)})",
                        "delayed share",
                    ),
                ),
                f"Share of requests blocked beyond the swap-delay SLO; line: {slos.lora_swap.max_delayed_ratio:.1%}.",
                threshold=Threshold(slos.lora_swap.max_delayed_ratio),
                min=0,
            ),
        ),
    )
    rejects = Row(
        "Rejected and aborted",
        (
            Panel(
                "Rejected requests",
                "reqps",
                (
                    Target(f"sum by (reason) ({rate('loadlens_request_rejections_total', SERVE)})", "{{reason}}"),
                    Target(f"sum by (reason) ({rate('vllm:admission_rejections_total', SERVE)})", "engine {{reason}}"),
                ),
                "Refused before generation, by reason; engine admission bounds (429s) separately.",
                min=0,
            ),
            Panel(
                "Aborted requests",
                "reqps",
                (
                    Target(f"sum by (reason) ({rate('loadlens_request_aborts_total', SERVE)})", "{{reason}}"),
                    Target(
                        f"sum by (finished_reason) ({rate('vllm:request_success_total', ENGINE_FAILED)})",
                        "engine {{finished_reason}}",
                    ),
                ),
                "Ended after admission: client went away, engine error, shutdown.",
                min=0,
            ),
        ),
    )
    return Dashboard(
        uid="loadlens-serving",
        title="loadlens / Serving engine",
        description="Scheduler, KV cache, batch size, preemptions, request phases, priority classes, LoRA, rejections.",
        rows=(sched, phases, classes, lora, rejects),
        variables=_variables(f"loadlens_build_info{{{job_selector(SERVE_JOB)}}}"),
        annotations=(_stage_annotation(), _alerts_annotation()),
    )


def dashboards(slo_file: Path | None = None) -> dict[str, Dashboard]:
    """File stem -> dashboard."""
    slos = load_slos(slo_file)
    return {"loadlens-overview": overview(), "loadlens-gpu": gpu(slos), "loadlens-serving": serving(slos)}
