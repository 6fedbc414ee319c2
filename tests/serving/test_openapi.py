"""The served OpenAPI document is truthful: request bodies, statuses and media types, and schemathesis
finds no 5xx and no response that breaks it (quick variant; ``python -m benchmarks.reliability`` runs >= 1,000
cases)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from benchmarks.reliability import fuzz
from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile
from exporters.serving.tracing import Tracing
from tests.support import required
from tests.support.server import serve_app

QUICK_EXAMPLES = 5
"""Per operation and phase: several hundred cases (``python -m benchmarks.reliability`` runs 100: 1,554)."""


@dataclass
class SimServer:
    url: str
    registry: CollectorRegistry


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    registry = CollectorRegistry()
    engine = SimEngine(load_model_profile("tiny"), load_gpu_profile("h100-sxm"), registry=registry, speed=1000.0)
    app = create_app(engine, ServeSettings(), registry=registry, tracing=Tracing.disabled())
    with serve_app(app) as url:
        yield SimServer(url, registry)


@pytest.fixture(scope="module")
def document(sim: SimServer) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(sim.url + "/openapi.json").json()
    return doc


def _op(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    op: dict[str, Any] = document["paths"][path][method]
    return op


def test_every_body_route_declares_its_request_body(document: dict[str, Any]) -> None:
    bodies = {
        (method.upper(), path): op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for path, item in document["paths"].items()
        for method, op in item.items()
        if "requestBody" in op
    }
    assert bodies == {
        ("POST", "/v1/chat/completions"): "#/components/schemas/ChatCompletionRequest",
        ("POST", "/v1/completions"): "#/components/schemas/CompletionRequest",
        ("POST", "/v1/responses"): "#/components/schemas/ResponsesRequest",
        ("POST", "/v1/load_lora_adapter"): "#/components/schemas/LoadLoRAAdapterRequest",
        ("POST", "/v1/unload_lora_adapter"): "#/components/schemas/UnloadLoRAAdapterRequest",
        ("PATCH", "/admin/knobs"): "#/components/schemas/KnobChanges",
    }
    for ref in bodies.values():
        assert ref.rsplit("/", 1)[1] in document["components"]["schemas"]


def test_statuses_and_media_types(document: dict[str, Any]) -> None:
    chat = _op(document, "post", "/v1/chat/completions")["responses"]
    assert sorted(chat) == ["200", "400", "404", "413", "429", "500", "503"]
    assert sorted(chat["200"]["content"]) == ["application/json", "text/event-stream"]
    responses = _op(document, "post", "/v1/responses")["responses"]
    assert sorted(responses) == ["200", "400", "404", "413", "429", "500", "501", "503"]
    assert chat["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    metrics = _op(document, "get", "/metrics")["responses"]["200"]["content"]
    assert sorted(metrics) == ["application/openmetrics-text", "text/plain"]
    device = _op(document, "get", "/sim/device-state")["responses"]
    assert sorted(device) == ["200", "400", "404", "500"]
    lora = _op(document, "post", "/v1/load_lora_adapter")["responses"]["200"]["content"]
    assert list(lora) == ["text/plain"]
    text = str(document)
    assert "422" not in document["paths"]["/sim/device-state"]["get"]["responses"]
    assert "HTTPValidationError" not in text


def test_request_schema_states_vllm_bounds(document: dict[str, Any]) -> None:
    props = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    seed = props["seed"]["anyOf"][0]
    assert (seed["minimum"], seed["maximum"]) == (-(2**63), 2**63 - 1)
    assert props["messages"]["minItems"] == 1
    content = document["components"]["schemas"]["ChatMessage"]["properties"]["content"]["anyOf"]
    assert {"type": "string"} in content
    assert any(alt.get("type") == "array" and alt.get("minItems") == 1 for alt in content)


@pytest.mark.slow
def test_schemathesis_finds_no_5xx_and_no_schema_violation(sim: SimServer) -> None:
    required.require_module("schemathesis")
    result = fuzz(sim.url, examples=QUICK_EXAMPLES, seed=1, timeout_s=300)
    assert result.errors == []
    assert result.failures == [], result.output
    assert result.exit_code == 0, result.output
    assert result.generated >= 500
    served_500 = sum(
        s.value
        for metric in sim.registry.collect()
        if metric.name == "loadlens_requests"
        for s in metric.samples
        if s.name == "loadlens_requests_total" and s.labels.get("code") == "500"
    )
    assert served_500 == 0


def test_proxy_document_admits_the_upstreams_statuses() -> None:
    from fastapi import FastAPI

    from exporters.serving.openapi import OPERATIONS, ROUTE_DOCS, build_openapi

    app = FastAPI()
    for key in OPERATIONS:
        method, path = key.split(" ", 1)
        app.add_api_route(path, lambda: None, methods=[method], **ROUTE_DOCS[key])
    proxy = build_openapi(app, forwards_upstream_errors=True)
    sim = build_openapi(app, forwards_upstream_errors=False)
    assert "default" in proxy["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "default" not in sim["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "default" not in proxy["paths"]["/v1/responses"]["post"]["responses"]
