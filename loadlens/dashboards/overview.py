"""The load test overview: stages, request rate, latency against the SLOs, throughput, goodput, errors."""

from __future__ import annotations

from loadlens.contracts.ports import SERVE_JOB, job_selector
from loadlens.dashboards.common import (
    CLIENT,
    CLIENT_FAILED,
    GENAI,
    LOADGEN,
    LOADGEN_STAGE,
    SERVE,
    SLO_DASHED,
    alerts_annotation,
    slo_line,
    stage_annotation,
    variables,
)
from loadlens.dashboards.model import Dashboard, Panel, Row, Target, Threshold, mean, quantile, rate


def _latency(title: str, histogram: str, selector: str, slo: str, description: str) -> Panel:
    return Panel(
        title,
        "s",
        (
            Target(quantile(0.5, histogram, selector), "p50"),
            Target(quantile(0.95, histogram, selector), "p95"),
            Target(quantile(0.99, histogram, selector), "p99"),
            Target(mean(histogram, selector), "mean"),
            slo_line(slo),
        ),
        description,
        dashed=SLO_DASHED,
    )


def dashboard() -> Dashboard:
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
                    slo_line("ttft"),
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
        variables=variables(f"loadlens_build_info{{{job_selector(SERVE_JOB)}}}"),
        annotations=(stage_annotation(), alerts_annotation()),
    )
