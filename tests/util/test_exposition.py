"""render(): the one /metrics content negotiation of the serving layer, the pager (and any http.server)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from loadlens.util.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, negotiate, render, wants_openmetrics

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_running", "running", ["model_name"], registry=registry).labels("m").set(3)
    Histogram("ttft_seconds", "ttft", buckets=(1.0,), registry=registry).observe(0.5, {"trace_id": "abc"})
    return registry


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, False),  # http.server's headers.get() when the header is absent
        ("", False),
        ("*/*", False),
        ("text/plain;version=0.0.4", False),
        ("application/openmetrics-text;q=0,text/plain", False),
        ("application/openmetrics-text;q=bogus", False),
        ("text/plain;q=0.5, application/openmetrics-text;version=1.0.0;q=0.1", True),
        (PROMETHEUS_ACCEPT, True),
    ],
)
def test_wants_openmetrics(accept: str | None, expected: bool) -> None:
    assert wants_openmetrics(accept) is expected


def test_text_when_not_asked_for_openmetrics() -> None:
    body, content_type = render(_registry(), None)
    assert content_type == TEXT_CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert body.startswith(
        b"# HELP vllm:num_requests_running running\n"
        b"# TYPE vllm:num_requests_running gauge\n"
        b'vllm:num_requests_running{model_name="m"} 3.0\n'
        b"# HELP ttft_seconds ttft\n"
        b"# TYPE ttft_seconds histogram\n"
        b'ttft_seconds_bucket{le="1.0"} 1.0\n'
        b'ttft_seconds_bucket{le="+Inf"} 1.0\n'
        b"ttft_seconds_count 1.0\n"
        b"ttft_seconds_sum 0.5\n"
    )
    assert b"trace_id" not in body  # exemplars exist only in OpenMetrics


def test_openmetrics_keeps_colon_names_and_exemplars() -> None:
    body, content_type = render(_registry(), PROMETHEUS_ACCEPT)
    assert content_type == OPENMETRICS_CONTENT_TYPE == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    lines = body.decode().splitlines()
    assert 'vllm:num_requests_running{model_name="m"} 3.0' in lines
    # The exemplar is followed by its timestamp.
    assert [x for x in lines if x.startswith('ttft_seconds_bucket{le="1.0"}')][0].startswith(
        'ttft_seconds_bucket{le="1.0"} 1.0 # {trace_id="abc"} 0.5 '
    )
    assert not any(line.startswith("vllm_") for line in lines)
    assert lines[-1] == "# EOF"


def test_text_encoder_is_used_for_text_only() -> None:
    registry = CollectorRegistry()
    Counter("c", "c", registry=registry).inc()
    seen: list[CollectorRegistry] = []

    def fast(reg: CollectorRegistry) -> bytes:
        seen.append(reg)
        return b"c_total 1.0\n"

    assert render(registry, "text/plain", text_encoder=fast) == (b"c_total 1.0\n", TEXT_CONTENT_TYPE)
    assert seen == [registry]
    body, content_type = render(registry, "application/openmetrics-text", text_encoder=fast)
    assert content_type == OPENMETRICS_CONTENT_TYPE
    assert b"c_total 1.0\n" in body and body.endswith(b"# EOF\n")
    assert seen == [registry]


PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;"
    "version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


@pytest.mark.parametrize(
    ("accept", "default", "text_first"),
    [
        (None, "text", "text"),
        ("", "text", "text"),
        ("*/*", "text", "text"),
        ("text/plain; version=0.0.4", "text", "text"),
        (PROMETHEUS_ACCEPT, "openmetrics", "text"),  # Prometheus 3's scrape header
        ("application/openmetrics-text; version=1.0.0", "openmetrics", "openmetrics"),
        ("application/openmetrics-text; q=0, text/plain", "text", "text"),
        ("application/openmetrics-text, text/plain; q=0", "openmetrics", "openmetrics"),
        ("application/openmetrics-text; q=bad", "text", "text"),
    ],
)
def test_negotiate(accept: str | None, default: str, text_first: str) -> None:
    assert negotiate(accept) == default
    assert negotiate(accept, prefer_text=True) == text_first
