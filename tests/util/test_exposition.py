from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from loadlens.util.exposition import render, wants_openmetrics

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (PROMETHEUS_ACCEPT, True),
        ("text/plain", False),
        ("", False),
        ("application/openmetrics-text; q=0", False),
        ("application/openmetrics-text; version=1.0.0", True),
    ],
)
def test_negotiation(accept: str, expected: bool) -> None:
    assert wants_openmetrics(accept) is expected


def test_colon_names_survive_openmetrics_and_exemplars_are_kept() -> None:
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_running", "running", ["model_name"], registry=registry).labels("m").set(3)
    Counter("vllm:prompt_tokens", "prompt", registry=registry).inc(5)
    Histogram("ttft_seconds", "ttft", buckets=(0.1, 1.0), registry=registry).observe(0.05, {"trace_id": "abc"})
    body, content_type = render(registry, PROMETHEUS_ACCEPT)
    text = body.decode()
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert 'vllm:num_requests_running{model_name="m"} 3.0' in text
    assert "vllm:prompt_tokens_total 5.0" in text
    assert "vllm_" not in text
    assert 'ttft_seconds_bucket{le="0.1"} 1.0 # {trace_id="abc"} 0.05' in text
    assert text.endswith("# EOF\n")
    plain, plain_type = render(registry, "text/plain")
    assert plain_type.startswith("text/plain; version=0.0.4")
    assert b'vllm:num_requests_running{model_name="m"} 3.0' in plain
    assert b"trace_id" not in plain
