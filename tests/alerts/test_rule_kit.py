"""Ctx.engine: one engine fact in every dialect, from the one mapping (loadlens/contracts/engine_series.py)."""

from __future__ import annotations

from loadlens.alerting.rule_kit import Ctx
from loadlens.contracts.slo import load_slos

SLOS = load_slos()
CTX = Ctx(SLOS, SLOS.alerting)
JOB = '{job="loadlens-serve"}'


def test_a_counterpart_joins_with_or() -> None:
    assert CTX.engine("vllm:num_preemptions_total", lambda s: f"rate({s}[1m])") == (
        f"rate(vllm:num_preemptions_total{JOB}[1m]) or rate(sglang:num_retracted_requests_total{JOB}[1m])"
    )


def test_matchers_and_constant_labels_come_from_the_mapping() -> None:
    # vLLM's part of the family and sglang's finish reason, as the dashboards' sglang view reads them.
    assert CTX.engine("vllm:request_success_total", lambda s: f"rate({s}[1m])") == (
        'rate(vllm:request_success_total{job="loadlens-serve",finished_reason=~"abort|error"}[1m])'
        ' or label_replace(rate(sglang:num_aborted_requests_total{job="loadlens-serve"}[1m]),'
        ' "finished_reason", "abort", "", "")'
    )
    assert CTX.engine("vllm:request_prefill_time_seconds", lambda s: s) == (
        f"vllm:request_prefill_time_seconds{JOB}"
        ' or sglang:per_stage_req_latency_seconds{job="loadlens-serve",stage="prefill_forward"}'
    )


def test_without_a_counterpart_only_vllm() -> None:
    assert CTX.engine("vllm:iteration_tokens_total", lambda s: s) == f"vllm:iteration_tokens_total{JOB}"
