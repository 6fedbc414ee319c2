"""vLLM's API-server HTTP series, for every engine: what prometheus-fastapi-instrumentator exports with the
defaults vLLM's ``vllm serve`` uses, so vLLM dashboards that chart HTTP traffic work against ``loadlens serve``.

vLLM instruments its FastAPI app with ``Instrumentator(excluded_handlers=[...])`` and the instrumentator's
default metric set. That means, and this module reproduces (it does not use the library):

- ``http_requests_total{method, status, handler}`` counter; ``status`` grouped to its class (``2xx``,
  ``4xx``, ``5xx``); ``handler`` the route template (``/v1/completions``), or ``none`` for a path no route
  matches (a 404), so unknown paths never become labels.
- ``http_request_duration_seconds{method, handler}`` histogram, buckets 0.1, 0.5, 1 (and +Inf).
- ``http_request_duration_highr_seconds`` histogram without labels, buckets 0.01 … 60 (21 bounds).
- ``http_request_size_bytes{handler}`` and ``http_response_size_bytes{handler}`` summaries of the
  ``Content-Length`` headers (0 when absent: streamed responses carry none).
- Durations run from the request entering the middleware to the last byte of the response handed to the
  server, so a streamed completion counts its whole stream.
- Handlers matching vLLM's exclusions (``/metrics``, ``/health``, ``/load``, ``/ping``, ``/version``,
  ``/server_info``, matched anywhere in the template as the instrumentator's regular expressions are) are
  not observed at all.

vLLM's API server also exposes prometheus_client's process collector (``process_cpu_seconds_total``,
``process_resident_memory_bytes``, ``process_start_time_seconds``, ``process_open_fds``, ...), which its
dashboards chart; :func:`install_http_metrics` adds it to the serving registry too.

Usage::

    install_http_metrics(app, registry)   # once, before the app serves
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, ProcessCollector
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from exporters.serving.metrics import Tallies
from exporters.serving.tallies import (
    CountTally,
    FoldingCounter,
    FoldingHistogram,
    FoldingSummary,
    HistogramTally,
    SummaryTally,
)

EXCLUDED_HANDLERS: tuple[str, ...] = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")
"""vLLM's ``excluded_handlers`` (regular expressions searched in the route template)."""

DURATION_BUCKETS: tuple[float, ...] = (0.1, 0.5, 1.0)
"""The instrumentator's ``latency_lowr_buckets`` (``http_request_duration_seconds``)."""

DURATION_HIGHR_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0,
    30.0, 60.0,
)  # fmt: skip
"""The instrumentator's ``latency_highr_buckets`` (``http_request_duration_highr_seconds``)."""

UNTEMPLATED = "none"
"""The handler label of a request no route matched."""


class HttpMetrics:
    """The five series, on the registry given. A request's observations go to plain-number tallies of the
    children (exporters/serving/tallies.py), folded in before every collect of the five."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.tallies = Tallies()
        self.requests = FoldingCounter(
            "http_requests_total",
            "Total number of requests by method, status and handler.",
            ("method", "status", "handler"),
            registry=registry,
        )
        self.request_size = FoldingSummary(
            "http_request_size_bytes",
            "Content length of incoming requests by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            ("handler",),
            registry=registry,
        )
        self.response_size = FoldingSummary(
            "http_response_size_bytes",
            "Content length of outgoing responses by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            ("handler",),
            registry=registry,
        )
        self.duration_highr = FoldingHistogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations. ",
            registry=registry,
            buckets=DURATION_HIGHR_BUCKETS,
        )
        self.duration = FoldingHistogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ",
            ("method", "handler"),
            registry=registry,
            buckets=DURATION_BUCKETS,
        )
        for folding in (self.requests, self.request_size, self.response_size, self.duration_highr, self.duration):
            folding.before_collect = self.tallies.fold
        self._highr = HistogramTally(self.duration_highr)
        self.tallies.keep(self._highr)
        self._children: dict[tuple[str, int, str], tuple[CountTally, SummaryTally, SummaryTally, HistogramTally]] = {}
        """Each (method, status, handler)'s children, bound once (``labels`` per request costs a lock and checks)."""

    def observe(
        self, method: str, status: int, handler: str, seconds: float, request_bytes: int, response_bytes: int
    ) -> None:
        key = (method, status, handler)
        children = self._children.get(key)
        if children is None:  # bound at the first request of its kind, as labels() on each request would be
            children = self._children[key] = (
                CountTally(self.requests.labels(method, f"{str(status)[0]}xx", handler)),
                SummaryTally(self.request_size.labels(handler)),
                SummaryTally(self.response_size.labels(handler)),
                HistogramTally(self.duration.labels(method, handler)),
            )
            self.tallies.keep(*children)
        requests, request_size, response_size, duration = children
        requests.inc()
        request_size.observe(request_bytes)
        response_size.observe(response_bytes)
        self._highr.observe(seconds)
        duration.observe(seconds)


def route_template(routes: Sequence[BaseRoute], scope: Scope) -> str | None:
    """The path template of the route that fully matches ``scope``, None if none does."""
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            path = getattr(route, "path", None)
            return path if isinstance(path, str) else None
    return None


def excluded(template: str, patterns: Sequence[str] = EXCLUDED_HANDLERS) -> bool:
    """Whether vLLM's exclusions (regular expressions searched in the template) keep a route unobserved."""
    return any(re.search(p, template) for p in patterns)


def content_length(headers: Sequence[tuple[bytes, bytes]]) -> int:
    """The ``Content-Length`` of ASGI headers as the instrumentator reads it: 0 when absent or not a number."""
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


class HttpMetricsMiddleware:
    """Pure ASGI middleware (no body buffering, so streaming passes straight through)."""

    def __init__(self, app: ASGIApp, *, metrics: HttpMetrics, excluded: Sequence[str] = EXCLUDED_HANDLERS) -> None:
        self.app = app
        self.metrics = metrics
        self.excluded = tuple(re.compile(x) for x in excluded)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        owner = scope.get("app")
        template = route_template(owner.routes, scope) if isinstance(owner, FastAPI) else None
        handler = template if template is not None else UNTEMPLATED
        matched_on = template if template is not None else str(scope.get("path", ""))
        if any(p.search(matched_on) for p in self.excluded):
            await self.app(scope, receive, send)
            return
        status = 500
        response_bytes = 0

        async def send_and_watch(message: Message) -> None:
            nonlocal status, response_bytes
            if message["type"] == "http.response.start":
                status = int(message["status"])
                response_bytes = content_length(message.get("headers", ()))
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            self.metrics.observe(
                scope["method"],
                status,
                handler,
                max(time.perf_counter() - start, 0.0),
                content_length(scope.get("headers", ())),
                response_bytes,
            )


def install_http_metrics(app: FastAPI, registry: CollectorRegistry) -> HttpMetrics:
    """Add the middleware to ``app``, its series and the process collector to ``registry``; returns the
    recorder."""
    metrics = HttpMetrics(registry)
    ProcessCollector(registry=registry)
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics)
    return metrics
