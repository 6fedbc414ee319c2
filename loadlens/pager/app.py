"""``loadlens pager``: a webhook receiver for Alertmanager that records and prints every page.

- ``POST /alerts`` (also ``/``): an Alertmanager version-4 webhook payload. Invalid JSON or a payload that is
  not version 4 → 400 with an OpenAI-style error body (the same shape as the serving layer's).
- Every accepted notification is appended to a JSONL log as one line, under a lock and with one ``write``
  per line, so concurrent posts never interleave or lose lines.
- Each alert is printed on stdout as it arrives, named by the receiver Alertmanager routed it to:
  ``PAGE firing critical LoadlensTTFTHigh ...`` (receiver ``pager``), ``TICKET firing warning ...`` (``ticket``).
- ``GET /pages``: the notifications received so far (for the demo and tests); ``/metrics``, ``/health``.
- ``GET /runbooks`` (HTML, one anchor per alert) and ``/runbooks.md``: what ``runbook_url`` links open.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import ValidationError
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from loadlens.pager.payload import WebhookPayload
from loadlens.pager.runbooks import render_html, runbooks_markdown
from loadlens.util.exposition import render as render_exposition
from loadlens.util.openai_errors import error_response

RECEIVER_KIND = {"pager": "PAGE", "ticket": "TICKET"}  # the receivers loadlens.alerting.alertmanager routes to
MAX_KEPT = 10_000
"""Notifications kept in memory for GET /pages; the JSONL log keeps everything."""


class PagerState:
    def __init__(self, log_path: Path, registry: CollectorRegistry, out: TextIO) -> None:
        self.log_path = log_path
        self.out = out
        self.lock = asyncio.Lock()
        self.received: list[dict[str, Any]] = []
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.notifications = Counter(
            "loadlens_pager_notifications",
            "Webhook notifications accepted, by receiver and group status.",
            ["receiver", "status"],
            registry=registry,
        )
        self.alerts = Counter(
            "loadlens_pager_alerts",
            "Alerts received inside notifications, by alert name, severity and status.",
            ["alertname", "severity", "status"],
            registry=registry,
        )
        self.invalid = Counter(
            "loadlens_pager_invalid_payloads",
            "Posts rejected with 400 (not JSON, not a v4 payload).",
            registry=registry,
        )
        self.last = Gauge(
            "loadlens_pager_last_notification_timestamp_seconds",
            "Unix time of the last accepted notification.",
            registry=registry,
        )

    async def record(self, payload: WebhookPayload, raw: dict[str, Any]) -> None:
        received_at = time.time()
        entry = {"received_at": received_at, **raw}
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        async with self.lock:
            # One write of the whole line on an O_APPEND descriptor: atomic with respect to other writers.
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
            self.received.append(entry)
            if len(self.received) > MAX_KEPT:
                del self.received[: len(self.received) - MAX_KEPT]
        self.notifications.labels(payload.receiver, payload.status).inc()
        self.last.set(received_at)
        # What the line is, by the receiver Alertmanager routed it to (a warning goes to "ticket", not a page).
        kind = RECEIVER_KIND.get(payload.receiver, f"NOTIFY[{payload.receiver}]")
        for alert in payload.alerts:
            name = alert.labels.get("alertname", "unknown")
            severity = alert.labels.get("severity", "none")
            self.alerts.labels(name, severity, alert.status).inc()
            where = " ".join(f"{k}={v}" for k, v in sorted(alert.labels.items()) if k not in ("alertname", "severity"))
            summary = alert.annotations.get("summary", "")
            print(f"{kind} {alert.status} {severity} {name} {where} :: {summary}", file=self.out, flush=True)


def create_pager_app(log_path: Path, registry: CollectorRegistry | None = None, out: TextIO | None = None) -> FastAPI:
    registry = registry or CollectorRegistry()
    state = PagerState(log_path, registry, out or sys.stdout)
    app = FastAPI(title="loadlens pager")
    app.state.pager = state

    async def receive(request: Request) -> Response:
        raw = await request.body()
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            state.invalid.inc()
            return error_response(400, f"body is not valid JSON: {err}")
        if not isinstance(doc, dict):
            state.invalid.inc()
            return error_response(400, "body must be a JSON object (Alertmanager webhook payload)")
        try:
            payload = WebhookPayload.model_validate(doc)
        except ValidationError as err:
            state.invalid.inc()
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return error_response(400, f"not an Alertmanager v4 payload: {where}: {first['msg']}", where or None)
        await state.record(payload, doc)
        return JSONResponse({"status": "ok", "alerts": len(payload.alerts)})

    app.add_api_route("/alerts", receive, methods=["POST"])
    app.add_api_route("/", receive, methods=["POST"])

    @app.get("/pages")
    async def pages() -> Response:
        return JSONResponse({"notifications": state.received})

    @app.get("/runbooks")
    async def runbooks() -> Response:
        text = runbooks_markdown()
        if text is None:
            return error_response(404, "runbooks are not installed with this copy of loadlens")
        return HTMLResponse(render_html(text))

    @app.get("/runbooks.md")
    async def runbooks_source() -> Response:
        text = runbooks_markdown()
        if text is None:
            return error_response(404, "runbooks are not installed with this copy of loadlens")
        return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        body, content_type = render_exposition(registry, request.headers.get("accept"))
        return Response(body, media_type=content_type)

    return app
