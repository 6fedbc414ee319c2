"""vLLM's API-server HTTP series (prometheus-fastapi-instrumentator defaults) from ``loadlens serve``, for
every engine: names, labels, status classes, route templates, exclusions, buckets and streamed durations."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile
from exporters.serving.http_metrics import DURATION_BUCKETS, DURATION_HIGHR_BUCKETS, HttpMetrics
from exporters.serving.tracing import Tracing
from tests.serving.conftest import Served
from tests.support.server import serve_app

COMPLETIONS = "/v1/completions"


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    v = registry.get_sample_value(name, labels)
    assert v is not None, f"{name}{labels} is missing"
    return v


def _wait_for(registry: CollectorRegistry, name: str, **labels: str) -> None:
    deadline = time.monotonic() + 30
    while registry.get_sample_value(name, labels) is None:
        assert time.monotonic() < deadline, f"{name}{labels} never appeared"
        time.sleep(0.005)


def _wait_until(registry: CollectorRegistry, name: str, at_least: float, **labels: str) -> None:
    """The middleware records a request once the app returned, after its last byte went out: a client can
    have read the response before. Wait for the sample to reach ``at_least`` (callers then assert it exactly)."""
    deadline = time.monotonic() + 30
    while (registry.get_sample_value(name, labels) or 0.0) < at_least:
        assert time.monotonic() < deadline, f"{name}{labels} stayed below {at_least}"
        time.sleep(0.005)


def test_requests_are_counted_by_method_status_class_and_route_template(served: Served) -> None:
    body = {"model": "scripted", "prompt": "hi", "max_tokens": 3}
    assert httpx.post(served.url + COMPLETIONS, json=body).status_code == 200
    assert httpx.post(served.url + COMPLETIONS, json={**body, "stream": True}).status_code == 200
    assert httpx.post(served.url + COMPLETIONS, json={**body, "model": "nope"}).status_code == 404
    assert httpx.get(served.url + "/v1/models").status_code == 200
    assert httpx.get(served.url + "/no/such/path").status_code == 404
    assert httpx.get(served.url + "/health").status_code == 200
    assert httpx.get(served.url + "/metrics").status_code == 200
    reg = served.registry
    # The duration is the last series a request updates: once each count is in, every series is.
    _wait_until(reg, "http_request_duration_seconds_count", 3, method="POST", handler=COMPLETIONS)
    _wait_until(reg, "http_request_duration_seconds_count", 1, method="GET", handler="/v1/models")
    _wait_until(reg, "http_request_duration_seconds_count", 1, method="GET", handler="none")
    assert _value(reg, "http_requests_total", method="POST", status="2xx", handler=COMPLETIONS) == 2
    assert _value(reg, "http_requests_total", method="POST", status="4xx", handler=COMPLETIONS) == 1
    assert _value(reg, "http_requests_total", method="GET", status="2xx", handler="/v1/models") == 1
    assert _value(reg, "http_requests_total", method="GET", status="4xx", handler="none") == 1  # untemplated
    # vLLM's exclusions: neither /health nor /metrics is observed.
    text = generate_latest(reg).decode()
    assert 'handler="/health"' not in text
    assert 'handler="/metrics"' not in text
    assert _value(reg, "http_request_duration_seconds_count", method="POST", handler=COMPLETIONS) == 3
    assert _value(reg, "http_request_duration_highr_seconds_count") == 5
    assert _value(reg, "http_request_size_bytes_count", handler=COMPLETIONS) == 3
    assert _value(reg, "http_request_size_bytes_sum", handler="/v1/models") == 0  # a GET has no body


def test_buckets_are_the_instrumentators_defaults() -> None:
    from tests.serving.fakes import ScriptedEngine

    reg = CollectorRegistry()
    app = create_app(ScriptedEngine(), ServeSettings(), registry=reg, tracing=Tracing.disabled())
    with serve_app(app) as url:
        httpx.get(url + "/v1/models")
    text = generate_latest(reg).decode()
    lowr = [line for line in text.splitlines() if line.startswith("http_request_duration_seconds_bucket")]
    assert [line.split('le="')[1].split('"')[0] for line in lowr] == [*map(str, DURATION_BUCKETS), "+Inf"]
    highr = [line for line in text.splitlines() if line.startswith("http_request_duration_highr_seconds_bucket")]
    assert [line.split('le="')[1].split('"')[0] for line in highr] == [*map(str, DURATION_HIGHR_BUCKETS), "+Inf"]
    assert len(DURATION_HIGHR_BUCKETS) == 21
    assert "# TYPE http_request_size_bytes summary" in text
    # vLLM's API server exposes the process collector too (its instances dashboard charts it).
    assert reg.get_sample_value("process_start_time_seconds") is not None
    assert (reg.get_sample_value("process_resident_memory_bytes") or 0) > 0
    assert "# TYPE http_response_size_bytes summary" in text


def test_a_streamed_completion_lasts_until_its_last_byte_on_the_sim_and_behind_the_proxy() -> None:
    """Both engines: the sim directly, and the OpenAI proxy in front of it (each app has its own series)."""
    sim_reg, proxy_reg = CollectorRegistry(), CollectorRegistry()
    engine = SimEngine(
        load_model_profile("deepseek-r1-distill-llama-8b"), load_gpu_profile("h100-sxm"), registry=sim_reg,
        served_model_name="m",
    )  # fmt: skip
    sim_app = create_app(engine, ServeSettings(), registry=sim_reg, tracing=Tracing.disabled())
    body = {"model": "m", "prompt": "hello " * 16, "max_tokens": 24, "stream": True, "ignore_eos": True}
    with serve_app(sim_app) as sim_url:
        proxy_app = create_app(OpenAIProxyEngine(sim_url), ServeSettings(), registry=proxy_reg,
                               tracing=Tracing.disabled())  # fmt: skip
        with serve_app(proxy_app) as proxy_url:
            for url, reg in ((sim_url, sim_reg), (proxy_url, proxy_reg)):
                start = time.monotonic()
                with httpx.stream("POST", url + COMPLETIONS, json=body, timeout=30) as r:
                    assert r.status_code == 200
                    for _ in r.iter_bytes():
                        pass
                # The middleware records once the app returns, a moment after the client read the last byte.
                _wait_for(reg, "http_request_duration_seconds_count", method="POST", handler=COMPLETIONS)
                wall = time.monotonic() - start  # from before the request to after the duration was recorded
                seconds = _value(reg, "http_request_duration_seconds_sum", method="POST", handler=COMPLETIONS)
                # 24 Llama-8B decode steps on an H100 take ~0.2 s: the duration covers the stream, not its
                # first bytes, and lies inside what the client saw (from sending to the record's appearance).
                assert seconds > 0.1
                assert seconds <= wall
                assert _value(reg, "http_requests_total", method="POST", status="2xx", handler=COMPLETIONS) == 1
                assert _value(reg, "http_response_size_bytes_sum", handler=COMPLETIONS) == 0  # no Content-Length
    # The proxy's own upstream calls are the sim's requests: counted there too.
    assert _value(sim_reg, "http_requests_total", method="POST", status="2xx", handler=COMPLETIONS) == 2


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_malformed_bodies_are_4xx_under_their_route(served: Served, path: str) -> None:
    r = httpx.post(served.url + path, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    _wait_for(served.registry, "http_requests_total", method="POST", status="4xx", handler=path)
    assert _value(served.registry, "http_requests_total", method="POST", status="4xx", handler=path) == 1


def test_each_method_status_and_handler_is_counted_on_its_own_children() -> None:
    """The children bound once per (method, status, handler) count what ``labels`` per request would."""
    registry = CollectorRegistry()
    http = HttpMetrics(registry)
    for status in (200, 404, 200, 201, 503):
        http.observe("POST", status, "/v1/completions", 0.2, 10, 5)
    http.observe("GET", 200, "/v1/models", 0.05, 0, 7)

    def value(name: str, labels: dict[str, str]) -> float | None:
        return registry.get_sample_value(name, labels)

    post = {"method": "POST", "handler": "/v1/completions"}
    assert value("http_requests_total", {**post, "status": "2xx"}) == 3
    assert value("http_requests_total", {**post, "status": "4xx"}) == 1
    assert value("http_requests_total", {**post, "status": "5xx"}) == 1
    assert value("http_requests_total", {"method": "GET", "handler": "/v1/models", "status": "2xx"}) == 1
    assert value("http_request_size_bytes_sum", {"handler": "/v1/completions"}) == 50
    assert value("http_response_size_bytes_sum", {"handler": "/v1/models"}) == 7
    assert value("http_request_duration_seconds_count", post) == 5
    assert value("http_request_duration_highr_seconds_count", {}) == 6
