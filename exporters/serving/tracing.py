"""OpenTelemetry tracing for the serving layer: configured by the standard ``OTEL_*`` variables, off when no
endpoint is set, and never in a request's way.

- Enabled when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and
  ``OTEL_TRACES_EXPORTER`` is not ``none``. Protocol from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` /
  ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``http/protobuf`` default; ``grpc`` needs the gRPC exporter package).
- Spans go through :class:`BoundedSpanProcessor`: a fixed-size queue drained by one thread. A full queue
  drops the span (``reason="queue_full"``), and so does an export the exporter gives up on after its retries
  (``reason="export_failed"``, e.g. no collector listening); both count in
  ``loadlens_trace_spans_dropped_total{reason}``. ``on_end`` never blocks.
- With tracing off, requests still get W3C ids (from ``traceparent`` or fresh) for logs and exemplars.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("loadlens.tracing")
_PROPAGATOR = TraceContextTextMapPropagator()
_urandom = os.urandom


# Reasons a span never reaches the collector (label values of loadlens_trace_spans_dropped_total).
QUEUE_FULL = "queue_full"
EXPORT_FAILED = "export_failed"


class BoundedSpanProcessor(SpanProcessor):
    """Batches finished spans to an exporter from a background thread; drops (and counts) when full."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue: int = 2048,
        max_batch: int = 512,
        interval_s: float = 1.0,
        on_drop: Callable[[str, int], None] | None = None,
    ) -> None:
        self._exporter = exporter
        self._queue: queue.Queue[ReadableSpan] = queue.Queue(maxsize=max_queue)
        self._max_batch = max_batch
        self._interval = interval_s
        self._on_drop = on_drop or (lambda reason, count: None)
        # Spans accepted into the queue and spans whose export finished (or failed), under one condition:
        # force_flush waits on it for every span accepted before the call (the queue is FIFO).
        self._progress = threading.Condition()
        self._accepted = 0
        self._handled = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadlens-span-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        with self._progress:
            try:
                self._queue.put_nowait(span)
            except queue.Full:
                full = True
            else:
                full = False
                self._accepted += 1
        if full:
            self._on_drop(QUEUE_FULL, 1)

    def _drain(self) -> list[ReadableSpan]:
        batch: list[ReadableSpan] = []
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            result = self._exporter.export(batch)
        except Exception:  # an exporter bug must not kill the export thread
            log.exception("span export failed; %d spans lost", len(batch))
            result = SpanExportResult.FAILURE
        try:
            if result is not SpanExportResult.SUCCESS:
                self._on_drop(EXPORT_FAILED, len(batch))
        finally:  # handled either way: force_flush must not wait for a batch that is gone
            with self._progress:
                self._handled += len(batch)
                self._progress.notify_all()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                first = self._queue.get(timeout=self._interval)
            except queue.Empty:
                continue
            self._export([first, *self._drain()])
        while batch := self._drain():
            self._export(batch)

    def shutdown(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until every span ended before this call has been exported (or counted as failed); False if
        that took longer than ``timeout_millis``. The export thread does the exporting, in queue order: a span
        it has already taken off the queue is waited for, not overtaken (draining the queue here returned while
        that span was still on its way)."""
        if not self._thread.is_alive():  # shut down: nothing else will export what is left
            while batch := self._drain():
                self._export(batch)
        with self._progress:
            target = self._accepted
            return self._progress.wait_for(lambda: self._handled >= target, timeout_millis / 1000)


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower() == "none":
        return False
    if (env.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def build_exporter() -> SpanExporter:
    protocol = _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError as err:
            raise RuntimeError(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc; "
                "install it or use http/protobuf"
            ) from err
        return GrpcExporter()  # type: ignore[no-any-return]
    if protocol != "http/protobuf":
        raise RuntimeError(f"unsupported OTLP protocol {protocol!r} (use http/protobuf or grpc)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


@dataclass(slots=True)
class Tracing:
    """The serving layer's tracing handle. ``tracer`` is None when tracing is off."""

    tracer: trace.Tracer | None
    provider: TracerProvider | None

    @classmethod
    def disabled(cls) -> Tracing:
        return cls(tracer=None, provider=None)

    @classmethod
    def from_env(
        cls, service_version: str, on_drop: Callable[[str, int], None], exporter: SpanExporter | None = None
    ) -> Tracing:
        """Configure from OTEL_* (or with an explicit exporter, for tests)."""
        if exporter is None:
            if not tracing_requested():
                return cls.disabled()
            exporter = build_exporter()
        resource = Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", "loadlens-serve"), "service.version": service_version}
        )
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BoundedSpanProcessor(exporter, on_drop=on_drop))
        return cls(tracer=provider.get_tracer("loadlens.serving", service_version), provider=provider)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def extract_context(headers: Mapping[str, str]) -> Context:
    return _PROPAGATOR.extract(carrier=dict(headers))


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace_id, parent span_id) hex from a W3C traceparent, or None when absent or invalid."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    trace_id, span_id = parts[1].lower(), parts[2].lower()
    try:
        int(trace_id, 16), int(span_id, 16)
    except ValueError:
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id


def new_trace_id() -> str:
    return _urandom(16).hex()  # secrets.token_hex(16), without its two calls between


def new_span_id() -> str:
    return _urandom(8).hex()  # secrets.token_hex(8)


def new_request_id() -> str:
    """``uuid.uuid4().hex``: 122 random bits with the version 4 and RFC 4122 variant bits set, as 32 lowercase hex
    digits; without the ``UUID`` object (a generation request's id, made once per request)."""
    n = int.from_bytes(_urandom(16), "big")
    n = (n & ~(0xF000 << 64) | (4 << 76)) & ~(0xC000 << 48) | (0x8000 << 48)
    return f"{n:032x}"
