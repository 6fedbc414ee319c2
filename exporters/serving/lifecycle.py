"""One generation request from admission to its last byte: timing, metrics, span, log line, SLA verdict.

The HTTP layer creates a :class:`RequestLifecycle` when a request arrives and calls ``on_event`` for every
output event it sends, then exactly one of ``finish_ok`` / ``finish_error`` / ``finish_abort`` /
``reject``. Everything a request is measured by is decided here, in one place, for every engine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from exporters.serving.engine import RequestTiming
from exporters.serving.metrics import SeriesSet, ServingMetrics, StreamTally
from exporters.serving.request_log import RequestLogger
from exporters.serving.tracing import new_span_id, new_trace_id
from loadlens.contracts.slo import PriorityClass

OPERATION = {"chat": "chat", "completions": "text_completion"}


def _epoch_ns(mark: float, now_mono: float, now_ns: int) -> int:
    """Convert a time.monotonic() mark to epoch nanoseconds (span event timestamps)."""
    return now_ns - int((now_mono - mark) * 1e9)


@dataclass(slots=True)
class RequestLifecycle:
    metrics: ServingMetrics
    logger: RequestLogger
    request_id: str
    path: str
    operation: str
    model_label: str
    requested_model: str
    priority: int
    cls: PriorityClass
    stream: bool
    arrival: float
    trace_id: str
    span_id: str
    span: Span | None = None
    series: SeriesSet | None = None
    tally: StreamTally | None = None
    """This request's output tokens and inter-token gaps, from admission until it finishes (metrics.py)."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None
    whole: bool = False
    """The answer arrived whole (``on_whole``): no time to first token exists, so none is judged."""
    admitted: bool = False
    done: bool = False
    extra: dict[str, object] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        *,
        metrics: ServingMetrics,
        logger: RequestLogger,
        tracer: trace.Tracer | None,
        parent: Context | None,
        parent_ids: tuple[str, str] | None,
        request_id: str,
        path: str,
        endpoint: str,
        requested_model: str,
        model_label: str,
        priority: int,
        priority_class: PriorityClass,
        stream: bool,
        arrival: float,
    ) -> RequestLifecycle:
        operation = OPERATION.get(endpoint, endpoint)
        span: Span | None = None
        if tracer is not None:
            span = tracer.start_span(
                f"{operation} {model_label}",  # span names stay low-cardinality: served names only
                context=parent,
                kind=SpanKind.SERVER,
                start_time=_epoch_ns(arrival, time.monotonic(), time.time_ns()),
                attributes={
                    "gen_ai.operation.name": operation,
                    "gen_ai.provider.name": metrics.provider,
                    "gen_ai.request.model": requested_model,
                    "gen_ai.request.id": request_id,
                    "gen_ai.request.stream": stream,
                    "loadlens.priority": priority,
                    "loadlens.priority_class": priority_class.name,
                    "http.request.method": "POST",
                    "url.path": path,
                },
            )
            ctx = span.get_span_context()
            trace_id, span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
        else:
            trace_id = parent_ids[0] if parent_ids else new_trace_id()
            span_id = new_span_id()
        return cls(
            metrics=metrics,
            logger=logger,
            request_id=request_id,
            path=path,
            operation=operation,
            model_label=metrics.model_label(model_label),
            requested_model=requested_model,
            priority=priority,
            cls=priority_class,
            stream=stream,
            arrival=arrival,
            trace_id=trace_id,
            span_id=span_id,
            span=span,
        )

    # --- admission --------------------------------------------------------------------------------------

    def set_request_attributes(self, max_tokens: int, temperature: float, seed: int | None) -> None:
        if self.span is not None:
            self.span.set_attribute("gen_ai.request.max_tokens", max_tokens)
            self.span.set_attribute("gen_ai.request.temperature", temperature)
            if seed is not None:
                self.span.set_attribute("gen_ai.request.seed", seed)

    def admit(self) -> None:
        self.admitted = True
        self.series = self.metrics.series(self.operation, self.model_label, self.cls.name)
        self.series.in_flight.inc()
        self.tally = self.metrics.tallies.open(self.series)

    def withdraw(self) -> None:
        """Undo :meth:`admit` for a request the engine refused after all (a non-streamed request through the
        proxy is in flight while the upstream works on it: its refusal comes then). No-op when not admitted."""
        if self.admitted and self.series is not None:
            self.series.in_flight.dec()
        self.admitted = False
        self._close_tally()

    def _close_tally(self) -> None:
        """Fold this request's tally into the shared series: at its end, after its last ``on_event``."""
        if self.tally is not None:
            self.metrics.tallies.close(self.tally)

    # --- per event (hot path) ---------------------------------------------------------------------------

    def on_event(self, now: float, new_tokens: int, prompt_tokens: int, output_tokens: int) -> None:
        tally = self.tally
        assert tally is not None
        self.prompt_tokens = prompt_tokens
        if new_tokens <= 0:
            self.output_tokens = max(self.output_tokens, output_tokens)
            return
        self.output_tokens = output_tokens
        tally.tokens += new_tokens
        if self.first_token_at is None:
            self.first_token_at = now
            if self.span is not None:
                self.span.add_event("gen_ai.first_token", timestamp=time.time_ns())
        elif self.last_token_at is not None:
            tally.observe_itl(now - self.last_token_at)
        self.last_token_at = now

    def on_whole(self, prompt_tokens: int, output_tokens: int) -> None:
        """An answer that arrived whole (a proxy relaying a non-streamed upstream answer): its tokens are
        counted; they have no arrival times, so there is no first token and no inter-token gap."""
        tally = self.tally
        assert tally is not None
        self.whole = True
        self.prompt_tokens = prompt_tokens
        if output_tokens > self.output_tokens:
            tally.tokens += output_tokens - self.output_tokens
        self.output_tokens = max(self.output_tokens, output_tokens)

    # --- endings ----------------------------------------------------------------------------------------

    def finish_ok(self, finish_reason: str | None, timing: RequestTiming, cached_tokens: int = 0) -> None:
        if self.done:
            return
        self.done = True
        now = time.monotonic()
        series = self.series
        assert series is not None
        series.in_flight.dec()
        self._close_tally()
        self.finish_reason = finish_reason
        exemplar = {"trace_id": self.trace_id}
        e2e = now - self.arrival
        ttft = (self.first_token_at - self.arrival) if self.first_token_at is not None else None
        tpot = None
        if ttft is not None and self.output_tokens > 1 and self.last_token_at is not None:
            tpot = (self.last_token_at - self.first_token_at) / (self.output_tokens - 1)  # type: ignore[operator]
        if ttft is not None:
            series.ttft.observe(ttft, exemplar)
        if tpot is not None:
            series.tpot.observe(tpot, exemplar)
        series.duration_ok.observe(e2e, exemplar)
        series.tokens_in.observe(self.prompt_tokens)
        series.tokens_out.observe(self.output_tokens)
        if timing.lora_blocked_seconds > 0:
            series.lora_blocking.observe(timing.lora_blocked_seconds, exemplar)
            if timing.lora_blocked_seconds > self.metrics.slos.lora_swap.delay_seconds:
                series.lora_delayed.inc()
        # SLA verdict for this request's class.
        missed = []
        if (ttft is None and not self.whole) or (ttft is not None and ttft > self.cls.ttft_seconds):
            missed.append("ttft")
        if tpot is not None and tpot > self.cls.itl_seconds:
            missed.append("itl")
        if e2e > self.cls.e2e_seconds:
            missed.append("e2e")
        series.finished.inc()
        for slo in missed:
            series.breach[slo].inc()
        if not missed:
            series.goodput.inc()
        self.metrics.bind_ok(series, self.model_label, self.cls.name).inc()
        self._end_span(timing, now, None, cached_tokens)
        self._log(
            logging.INFO,
            status=200,
            ttft_ms=None if ttft is None else ttft * 1000,
            tpot_ms=None if tpot is None else tpot * 1000,
            e2e_ms=e2e * 1000,
            finish_reason=finish_reason,
            sla_missed=",".join(missed) or None,
            timing=timing,
        )

    def finish_abort(self, reason: str, timing: RequestTiming | None) -> None:
        """Ended after admission without a normal finish: client went away (499) or shutdown."""
        if self.done:
            return
        self.done = True
        now = time.monotonic()
        if self.series is not None:
            self.series.in_flight.dec()
        self._close_tally()
        self.metrics.aborts.labels(self.model_label, reason).inc()
        self.metrics.requests.labels(self.model_label, self.cls.name, "499").inc()
        self.metrics.duration.labels(
            self.operation, self.metrics.provider, self.model_label, self.cls.name, "aborted"
        ).observe(now - self.arrival, {"trace_id": self.trace_id})
        self._end_span(timing, now, f"aborted:{reason}", 0)
        self._log(logging.INFO, status=499, e2e_ms=(now - self.arrival) * 1000, abort_reason=reason, timing=timing)

    def finish_error(self, status: int, error_type: str, message: str, timing: RequestTiming | None) -> None:
        """Failed after admission (engine error mid-generation)."""
        if self.done:
            return
        self.done = True
        now = time.monotonic()
        if self.series is not None:
            self.series.in_flight.dec()
        self._close_tally()
        self.metrics.aborts.labels(self.model_label, "engine_error").inc()
        self._record_failure(status, error_type, now)
        self._end_span(timing, now, error_type, 0, message)
        self._log(logging.WARNING, status=status, e2e_ms=(now - self.arrival) * 1000, error=message, timing=timing)

    def reject(self, status: int, reason: str, message: str) -> None:
        """Refused before generation started (validation, unknown model, queue full, unavailable)."""
        if self.done:
            return
        self.done = True
        now = time.monotonic()
        self.metrics.rejections.labels(self.model_label, reason).inc()
        self._record_failure(status, reason, now)
        self._end_span(None, now, reason, 0, message)
        level = logging.WARNING if status >= 500 else logging.INFO
        self._log(level, status=status, e2e_ms=(now - self.arrival) * 1000, error=message, reject_reason=reason)

    def _record_failure(self, status: int, error_type: str, now: float) -> None:
        self.metrics.requests.labels(self.model_label, self.cls.name, str(status)).inc()
        self.metrics.duration.labels(
            self.operation, self.metrics.provider, self.model_label, self.cls.name, error_type
        ).observe(now - self.arrival, {"trace_id": self.trace_id})

    # --- span and log -----------------------------------------------------------------------------------

    def _end_span(
        self, timing: RequestTiming | None, now: float, error: str | None, cached: int, message: str = ""
    ) -> None:
        span = self.span
        if span is None:
            return
        now_ns = time.time_ns()
        if timing is not None:
            for name, mark in (
                ("gen_ai.queued", timing.queued),
                ("gen_ai.prefill.start", timing.scheduled),
                ("gen_ai.engine.first_token", timing.first_token),
                ("gen_ai.decode.end", timing.finished),
            ):
                if mark is not None:
                    span.add_event(name, timestamp=_epoch_ns(mark, now, now_ns))
            if timing.lora_blocked_seconds:
                span.set_attribute("loadlens.lora_blocked_seconds", timing.lora_blocked_seconds)
            if timing.preemptions:
                span.set_attribute("loadlens.preemptions", timing.preemptions)
        span.set_attribute("gen_ai.usage.input_tokens", self.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", self.output_tokens)
        if cached:
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", cached)
        if self.finish_reason is not None:
            span.set_attribute("gen_ai.response.finish_reasons", [self.finish_reason])
        if self.first_token_at is not None:
            span.set_attribute("gen_ai.response.time_to_first_chunk", self.first_token_at - self.arrival)
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, message or error))
        span.end(end_time=now_ns)

    def _log(self, level: int, *, timing: RequestTiming | None = None, **fields: object) -> None:
        if not self.logger.enabled(level):
            return
        record: dict[str, object] = {
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "method": "POST",
            "path": self.path,
            "model": self.requested_model,
            "stream": self.stream,
            "priority": self.priority,
            "priority_class": self.cls.name,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }
        if timing is not None:
            if timing.queued is not None and timing.scheduled is not None:
                record["queue_ms"] = (timing.scheduled - timing.queued) * 1000
            if timing.preemptions:
                record["preemptions"] = timing.preemptions
            if timing.lora_blocked_seconds:
                record["lora_blocked_ms"] = timing.lora_blocked_seconds * 1000
        record.update({k: v for k, v in fields.items() if v is not None})
        record.update(self.extra)
        self.logger.log(record, level)
