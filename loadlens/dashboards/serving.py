"""The serving engine dashboard: scheduler, KV cache, batch size, request phases, priority classes, LoRA,
rejections, and the simulator's own timing (sim engine only).

Two views from the same panels: vLLM's metric dialect (``loadlens-serving``: vLLM, and the sim, which speaks
it) and sglang's (``loadlens-serving-sglang``); ``engine.EngineView`` maps each engine series through
loadlens/contracts/engine_series.py and leaves out what sglang does not export.
Constant thresholds (KV cache, fairness, swap share) come from the SLO file, baked in at generation time.
"""

from __future__ import annotations

from loadlens.contracts.engine_series import Dialect
from loadlens.contracts.ports import SERVE_JOB, job_selector
from loadlens.contracts.slo import SLOConfig
from loadlens.dashboards.common import (
    GENAI,
    LOADGEN,
    SERVE,
    SERVE_ANY,
    SLO_DASHED,
    alerts_annotation,
    slo_line,
    stage_annotation,
    variables,
)
from loadlens.dashboards.engine import Absent, Drawn, EngineView
from loadlens.dashboards.model import Dashboard, Panel, Row, Target, Threshold, increase, mean, quantile, rate

UIDS: dict[Dialect, str] = {"vllm": "loadlens-serving", "sglang": "loadlens-serving-sglang"}
TITLES: dict[Dialect, str] = {"vllm": "loadlens / Serving engine", "sglang": "loadlens / Serving engine (sglang)"}

# Adapter lists longer than this count as this many (PromQL has no string functions, so the count is a ladder).
LORA_COUNT_CAP = 8


def lora_adapter_count(label: str, selector: str, cap: int = LORA_COUNT_CAP) -> str:
    """How many adapters ``label`` of ``vllm:lora_requests_info`` names (comma-joined), summed over instances.

    vLLM keeps every label set it ever exported (the value is the update time), so only each instance's latest
    set counts. Each rung matches lists of exactly n names (the last, ``cap`` or more) and yields n; ``""`` is 0.
    """
    info = f"vllm:lora_requests_info{{{selector}"
    latest = f"on (instance) group_left () max by (instance) ({info}}})"
    rungs = [f'({info}, {label}=""}} == {latest}) * 0']
    for n in range(1, cap + 1):
        more = f"{{{n - 1},}}" if n == cap else f"{{{n - 1}}}"
        pattern = "[^,]+" if n == 1 else f"[^,]+(,[^,]+){more}"
        rungs.append(f'({info}, {label}=~"{pattern}"}} == {latest}) * 0 + {n}')
    return "sum(" + " or ".join(rungs) + ")"


def _row(title: str, panels: tuple[Panel | None, ...]) -> Row | None:
    kept = tuple(p for p in panels if p is not None)
    return Row(title, kept) if kept else None


def _spread(e: EngineView, vllm: str) -> list[Target | Drawn | Absent]:
    """p50, p99 and mean of an engine histogram."""
    return [
        e.target(vllm, lambda s: s.quantile(0.5, SERVE), "p50"),
        e.target(vllm, lambda s: s.quantile(0.99, SERVE), "p99"),
        e.target(vllm, lambda s: s.mean(SERVE), "mean"),
    ]


def dashboard(slos: SLOConfig, dialect: Dialect = "vllm") -> Dashboard:
    e = EngineView(dialect)
    sched = _row(
        "Scheduler",
        (
            e.panel(
                Panel(
                    "Running / waiting",
                    "short",
                    (),
                    "Requests in the engine's batch, waiting for it (capacity or deferred for LoRA slots), and "
                    "admitted.",
                    min=0,
                ),
                [
                    e.target("vllm:num_requests_running", lambda s: f"sum({s.gauge(SERVE)})", "running"),
                    e.target("vllm:num_requests_waiting", lambda s: f"sum({s.gauge(SERVE)})", "waiting"),
                    e.target(
                        "vllm:num_requests_waiting_by_reason",
                        lambda s: f"sum by (reason) ({s.gauge(SERVE)})",
                        "waiting: {{reason}}",
                    ),
                    Target(f"sum(loadlens_requests_in_flight{{{SERVE}}})", "in flight (serving layer)"),
                ],
            ),
            e.panel(
                Panel(
                    "KV cache usage",
                    "percentunit",
                    (),
                    "Referenced KV blocks / all blocks.",
                    threshold=Threshold(slos.alerting["kv_cache_usage_ratio"]),
                    min=0,
                    max=1,
                ),
                [e.target("vllm:kv_cache_usage_perc", lambda s: f"max({s.gauge(SERVE)})", "KV cache used")],
            ),
            e.panel(
                Panel(
                    "Batch size (iteration tokens)",
                    "short",
                    (),
                    "Tokens per engine step (prompt tokens of requests reaching their first token + generated tokens).",
                    min=0,
                ),
                _spread(e, "vllm:iteration_tokens_total"),
            ),
            e.panel(
                Panel(
                    "Preemptions",
                    "ops",
                    (),
                    "Requests preempted (KV cache pressure) per second; they recompute later.",
                    min=0,
                ),
                [e.target("vllm:num_preemptions_total", lambda s: f"sum({s.rate(SERVE)})", "preemptions/s")],
            ),
        ),
    )
    phases = _row(
        "Request phases",
        tuple(
            e.panel(Panel(f"{name} time", "s", (), what, width=8), _spread(e, f"vllm:request_{metric}_time_seconds"))
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
                    slo_line("ttft"),
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
    lora = _row(
        "LoRA adapters",
        (
            e.panel(
                Panel(
                    "LoRA adapters in use",
                    "short",
                    (),
                    "Adapters the batch's requests use and adapters requests wait for (counted from the "
                    f"comma-joined names in vllm:lora_requests_info, its latest label set per instance; "
                    f"{LORA_COUNT_CAP} means {LORA_COUNT_CAP} or more), and runtime load/unload calls per interval."
                    if dialect == "vllm"
                    else "Runtime adapter load/unload calls through the proxy per interval.",
                    min=0,
                ),
                [
                    # The ladder reads vLLM's info series itself: only the vLLM name is queried here.
                    e.target(
                        "vllm:lora_requests_info",
                        lambda _: lora_adapter_count("running_lora_adapters", SERVE_ANY),
                        "adapters running",
                    ),
                    e.target(
                        "vllm:lora_requests_info",
                        lambda _: lora_adapter_count("waiting_lora_adapters", SERVE_ANY),
                        "adapters waiting",
                    ),
                    Target(
                        "sum by (operation, outcome)"
                        f" ({increase('loadlens_lora_adapter_operations_total', SERVE_ANY)})",
                        "{{operation}} {{outcome}}",
                    ),
                ],
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
    rejects = _row(
        "Rejected and aborted",
        (
            e.panel(
                Panel(
                    "Rejected requests",
                    "reqps",
                    (),
                    "Refused before generation, by reason; engine admission bounds (429s) separately.",
                    min=0,
                ),
                [
                    Target(f"sum by (reason) ({rate('loadlens_request_rejections_total', SERVE)})", "{{reason}}"),
                    e.target(
                        "vllm:admission_rejections_total",
                        lambda s: f"sum by (reason) ({s.rate(SERVE)})",
                        "engine {{reason}}",
                    ),
                ],
            ),
            e.panel(
                Panel(
                    "Aborted requests",
                    "reqps",
                    (),
                    "Ended after admission: client went away, engine error, shutdown.",
                    min=0,
                ),
                [
                    Target(f"sum by (reason) ({rate('loadlens_request_aborts_total', SERVE)})", "{{reason}}"),
                    e.target(
                        "vllm:request_success_total",
                        lambda s: f"sum by (finished_reason) ({s.rate(SERVE)})",
                        "engine {{finished_reason}}",
                    ),
                ],
            ),
        ),
    )
    # The sim speaks vLLM's dialect; an sglang upstream is never the sim.
    sim = Row(
        "Simulator timing (sim engine only)",
        (
            Panel(
                "Sim lag behind real time",
                "s",
                (
                    Target(f"max(loadlens_sim_lag_seconds{{{SERVE_ANY}}})", "lag now"),
                    Target(quantile(0.99, "loadlens_sim_timing_error_seconds", SERVE_ANY), "wake-up lateness p99"),
                    Target(mean("loadlens_sim_timing_error_seconds", SERVE_ANY), "wake-up lateness mean"),
                ),
                "How late the simulated engine delivered its steps against its modeled schedule. Its latency "
                "series are measured as delivered, so they include this lag; above ~2 ms the sim is not keeping "
                "real time (CPU-starved) and the modeled GPU is faster than what clients see.",
                threshold=Threshold(0.002),
                min=0,
            ),
            Panel(
                "Late steps and schedule restarts",
                "ops",
                (
                    Target(f"sum({rate('loadlens_sim_late_steps_total', SERVE_ANY)})", "late steps/s (> 2 ms)"),
                    Target(f"sum({rate('loadlens_sim_schedule_slips_total', SERVE_ANY)})", "schedule restarts/s"),
                ),
                "Steps that woke more than 2 ms after their deadline, and restarts of the schedule after falling "
                "more than 0.25 s behind.",
                min=0,
            ),
        ),
    )
    rows = tuple(r for r in (sched, phases, classes, lora, rejects, sim if dialect == "vllm" else None) if r)
    description = "Scheduler, KV cache, batch size, preemptions, request phases, priority classes, LoRA, rejections."
    if dialect != "vllm":
        left_out = "; ".join(title for title, _ in e.absent_panels)
        description = (
            f"The serving dashboard for an {dialect} upstream behind loadlens serve --engine openai, its {dialect}: "
            f"series in place of vLLM's. Left out ({dialect} exports no counterpart): {left_out}; and the "
            "simulator's timing (sim engine only). docs/metrics.md lists the mapping."
        )
    return Dashboard(
        uid=UIDS[dialect],
        title=TITLES[dialect],
        description=description,
        rows=rows,
        variables=variables(f"loadlens_build_info{{{job_selector(SERVE_JOB)}}}"),
        annotations=(stage_annotation(), alerts_annotation()),
    )
