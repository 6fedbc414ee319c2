"""Spans: one SERVER span per request, parented on traceparent, GenAI attributes, bounded export queue."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from exporters.serving import tracing
from exporters.serving.app import ServeSettings, create_app
from exporters.serving.tracing import BoundedSpanProcessor, Tracing, parse_traceparent, tracing_requested
from tests.serving.fakes import ScriptedEngine
from tests.support.server import serve_app

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_span_per_request_with_genai_attributes_and_parent() -> None:
    exporter = InMemorySpanExporter()
    registry = CollectorRegistry()
    tracing = Tracing.from_env("test", lambda: None, exporter=exporter)
    app = create_app(ScriptedEngine(), ServeSettings(), registry=registry, tracing=tracing)
    with serve_app(app) as url:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
        assert httpx.post(url + "/v1/chat/completions", json=body, headers={"traceparent": TP}).status_code == 200
        assert httpx.post(url + "/v1/chat/completions", json={**body, "model": "nope"}).status_code == 404
        assert tracing.provider is not None
        tracing.provider.force_flush()
        spans = exporter.get_finished_spans()
    assert len(spans) == 2
    ok, bad = spans
    assert ok.name == "chat scripted"
    assert ok.kind is SpanKind.SERVER
    assert ok.context is not None and ok.parent is not None
    assert f"{ok.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert f"{ok.parent.span_id:016x}" == "00f067aa0ba902b7"
    attrs = dict(ok.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "scripted"
    assert attrs["gen_ai.request.model"] == "scripted"
    assert attrs["gen_ai.request.max_tokens"] == 3
    assert attrs["gen_ai.usage.input_tokens"] == 2  # the fake counts words of the rendered prompt
    assert attrs["gen_ai.usage.output_tokens"] == 3
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    names = [e.name for e in ok.events]
    assert names[0] == "gen_ai.first_token"
    assert {"gen_ai.queued", "gen_ai.prefill.start", "gen_ai.engine.first_token", "gen_ai.decode.end"} <= set(names)
    assert bad.name == "chat other"  # unknown names never reach span names
    assert bad.status.status_code is StatusCode.ERROR
    assert dict(bad.attributes or {})["error.type"] == "unknown_model"


class _SlowExporter(SpanExporter):
    def __init__(self) -> None:
        self.gate = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.gate.wait(5)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.gate.set()


def test_full_export_queue_drops_and_counts_without_blocking() -> None:
    exporter = _SlowExporter()
    drops: list[int] = []

    def on_drop(reason: str, count: int) -> None:
        assert reason == "queue_full"
        drops.extend([1] * count)

    proc = BoundedSpanProcessor(exporter, max_queue=2, interval_s=0.01, on_drop=on_drop)
    span = object()
    for _ in range(10):
        proc.on_end(span)  # type: ignore[arg-type]
    # The worker holds at most one batch; the queue holds 2; everything else was dropped, instantly.
    assert 6 <= len(drops) <= 8
    exporter.gate.set()
    proc.shutdown()


class _GatedExporter(SpanExporter):
    """Records each batch once ``gate`` opens: an exporter in the middle of a slow OTLP round trip."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.batches: list[list[object]] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        assert self.gate.wait(30)
        self.batches.append(list(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.gate.set()


def test_force_flush_waits_for_the_batch_the_export_thread_holds() -> None:
    """force_flush returns once every span ended before it was exported, in order, and not before: it used to
    drain only the queue, so a span the export thread had taken (being exported, or the thread descheduled)
    was still missing when it returned, and the spans queued behind it were exported ahead of it."""
    exporter = _GatedExporter()
    proc = BoundedSpanProcessor(exporter, interval_s=0.01)
    first, second = object(), object()
    proc.on_end(first)  # type: ignore[arg-type]
    proc.on_end(second)  # type: ignore[arg-type]
    assert proc.force_flush(timeout_millis=50) is False  # nothing can have been exported: the gate is shut
    assert exporter.batches == []
    exporter.gate.set()
    assert proc.force_flush() is True
    assert [span for batch in exporter.batches for span in batch] == [first, second]
    proc.shutdown()


class _FailingExporter(SpanExporter):
    def __init__(self, raises: bool) -> None:
        self.raises = raises

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.raises:
            raise RuntimeError("exporter bug")
        return SpanExportResult.FAILURE  # what the OTLP exporters return once their retries are spent

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize("raises", [False, True], ids=["failure-result", "exception"])
def test_failed_export_counts_every_span_of_the_batch(raises: bool) -> None:
    drops: list[tuple[str, int]] = []
    proc = BoundedSpanProcessor(
        _FailingExporter(raises), interval_s=0.01, on_drop=lambda reason, n: drops.append((reason, n))
    )
    for _ in range(3):
        proc.on_end(object())  # type: ignore[arg-type]
    proc.force_flush()
    proc.shutdown()
    assert sum(n for _, n in drops) == 3
    assert {reason for reason, _ in drops} == {"export_failed"}


def test_tracing_env_switch() -> None:
    assert not tracing_requested({})
    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"})
    assert not tracing_requested({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (TP, ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-zz-01", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_parse_traceparent(value: str | None, expected: tuple[str, str] | None) -> None:
    assert parse_traceparent(value) == expected


def test_request_log_line_carries_trace_id(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(
        ScriptedEngine(), ServeSettings(log_format="json"), registry=CollectorRegistry(), tracing=Tracing.disabled()
    )
    # caplog.at_level sets the logger's level for the block and puts it back after (a bare setLevel here left
    # every later request of this worker's in-process servers formatting and emitting its log line).
    with caplog.at_level(logging.INFO, logger="loadlens.request"), serve_app(app) as url:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        httpx.post(url + "/v1/chat/completions", json=body, headers={"traceparent": TP})
    import json

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "loadlens.request"]
    assert len(lines) == 1
    line = lines[0]
    assert line["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert line["status"] == 200
    assert line["output_tokens"] == 2
    assert line["finish_reason"] == "length"
    assert line["path"] == "/v1/chat/completions"
    assert line["ttft_ms"] > 0 and line["e2e_ms"] >= line["ttft_ms"]


@pytest.mark.parametrize("seed", [b"\x00" * 16, b"\xff" * 16, bytes(range(16)), bytes(range(200, 216))])
def test_ids_are_those_of_uuid4_and_token_hex_from_the_same_random_bytes(
    seed: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """new_request_id is uuid.uuid4().hex, new_trace_id / new_span_id secrets.token_hex(16 / 8), made from the
    same bytes of os.urandom."""
    monkeypatch.setattr(tracing, "_urandom", lambda n: seed[:n])
    assert tracing.new_request_id() == uuid.UUID(bytes=seed, version=4).hex
    assert tracing.new_trace_id() == seed.hex()
    assert tracing.new_span_id() == seed[:8].hex()


def test_request_ids_have_uuid4_form() -> None:
    ids = {tracing.new_request_id() for _ in range(200)}
    assert len(ids) == 200
    for value in ids:
        parsed = uuid.UUID(hex=value)
        assert (parsed.hex, parsed.version, parsed.variant) == (value, 4, uuid.RFC_4122)
