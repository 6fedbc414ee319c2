"""otel-collector.yaml, statically: every component a pipeline uses is defined and every defined one is used."""

from __future__ import annotations

from typing import Any

from loadlens.contracts.slo import load_slos
from tests.deploy.support import COLLECTOR, load_yaml

KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")
# Renamed in core v0.144.0 (old names are deprecated aliases).
DEPRECATED = {"otlp": "otlp_grpc", "otlphttp": "otlp_http"}


def _config() -> dict[str, Any]:
    doc = load_yaml(COLLECTOR)
    assert isinstance(doc, dict)
    return doc


def _type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def test_every_used_component_is_defined_and_every_defined_one_is_used() -> None:
    config = _config()
    pipelines = config["service"]["pipelines"]
    defined = {kind: set(config.get(kind) or {}) for kind in KINDS}
    used: dict[str, set[str]] = {kind: set() for kind in KINDS}
    used["extensions"] = set(config["service"].get("extensions", []))
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                if kind != "processors" and component in defined["connectors"]:
                    used["connectors"].add(component)
                else:
                    assert component in defined[kind], f"pipeline {name}: {kind[:-1]} {component} is not defined"
                    used[kind].add(component)
    for kind in KINDS:
        assert used[kind] == defined[kind], f"{kind}: defined but unused {sorted(defined[kind] - used[kind])}"


def test_connectors_join_pipelines_of_matching_signals() -> None:
    pipelines = _config()["service"]["pipelines"]
    for connector in _config()["connectors"]:
        as_exporter = [n for n, p in pipelines.items() if connector in p.get("exporters", [])]
        as_receiver = [n for n, p in pipelines.items() if connector in p.get("receivers", [])]
        assert as_exporter and as_receiver, f"connector {connector} must be an exporter and a receiver"
        if _type(connector) == "spanmetrics":
            assert all(_type(n) == "traces" for n in as_exporter)
            assert all(_type(n) == "metrics" for n in as_receiver)
        if _type(connector) == "forward":
            assert {_type(n) for n in as_exporter + as_receiver} == {"traces"}


def test_spanmetrics_sees_every_span_before_tail_sampling() -> None:
    pipelines = _config()["service"]["pipelines"]
    for name, pipeline in pipelines.items():
        if "spanmetrics" in pipeline.get("exporters", []):
            assert "tail_sampling" not in pipeline.get("processors", []), name
            assert "otlp" in pipeline["receivers"], name
    sampled = [n for n, p in pipelines.items() if "tail_sampling" in p.get("processors", [])]
    assert sampled
    for name in sampled:
        assert all(r in _config()["connectors"] for r in pipelines[name]["receivers"]), name


def test_processor_order_and_current_component_names() -> None:
    config = _config()
    for name, pipeline in config["service"]["pipelines"].items():
        processors = pipeline.get("processors", [])
        if "memory_limiter" in processors:
            assert processors[0] == "memory_limiter", name
        if "batch" in processors:
            assert processors[-1] == "batch", name
        if "otlp" in pipeline["receivers"]:
            assert processors[:1] == ["memory_limiter"], f"{name}: memory_limiter must come first"
    for component in config["exporters"]:
        assert _type(component) not in DEPRECATED, f"{component}: use {DEPRECATED[_type(component)]}"
    exporters = {_type(e) for e in config["exporters"]}
    assert {"prometheus", "otlp_grpc"} <= exporters
    assert config["exporters"]["prometheus"]["enable_open_metrics"] is True
    protocols = config["receivers"]["otlp"]["protocols"]
    assert set(protocols) == {"grpc", "http"}
    for proto in protocols.values():
        assert proto["endpoint"].startswith("0.0.0.0:"), "the default (localhost) is unreachable from other containers"


def test_spanmetrics_red_metrics_by_model_and_operation_with_exemplars() -> None:
    spanmetrics = _config()["connectors"]["spanmetrics"]
    assert {d["name"] for d in spanmetrics["dimensions"]} >= {"gen_ai.request.model", "gen_ai.operation.name"}
    assert spanmetrics["exemplars"]["enabled"] is True


def test_tail_sampling_keeps_errors_and_requests_slower_than_the_slo() -> None:
    policies = {p["type"]: p for p in _config()["processors"]["tail_sampling"]["policies"]}
    assert policies["status_code"]["status_code"]["status_codes"] == ["ERROR"]
    tightest_e2e = min(c.e2e_seconds for c in load_slos().classes)
    assert policies["latency"]["latency"]["threshold_ms"] == round(tightest_e2e * 1000)
    assert 0 < policies["probabilistic"]["probabilistic"]["sampling_percentage"] < 100
