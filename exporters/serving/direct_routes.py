"""Generation requests served below the FastAPI stack, with every effect that stack has on them.

A generation request through FastAPI passes Starlette's error middleware, FastAPI's telemetry and body-limit
middlewares, :class:`~exporters.serving.http_metrics.HttpMetricsMiddleware`, Starlette's exception
middleware, FastAPI's exit-stack middleware, the router's match over every route (and the HTTP metrics'
own), and FastAPI's request handler with its dependency solving, before the route's function runs. For a
proxied stream of 128 chunks that is a few microseconds of CPU per chunk, which a relay does not pay
(BENCHMARKS.md, *Proxy cost per chunk*). :class:`DirectRoutes` calls the same route functions for
``POST /v1/chat/completions`` and ``POST /v1/completions`` from the app's own ``__call__`` and does, for
them, what the stack does, and nothing it does not:

- **The route function**: the very function FastAPI's route calls, behind the same guard (``app.py``,
  ``guard``), with a ``Request`` of the same scope and ``receive``; its response is called with the
  server's ``send`` wrapped as below. Parsing, validation, errors, metrics, tracing, the request log and
  the lifecycle all happen inside it, so they are the same by construction.
- **HTTP metrics**: :meth:`HttpMetrics.observe` with the same arguments the middleware gives it: the route
  template (the path: these routes have no parameters), the status of ``http.response.start`` (500 if none
  went out), the ``Content-Length`` of the request and of the response, the time from entry to return;
  nothing for a template vLLM's exclusions match (none of these).
- **An exception escaping the route** (the route function and the response catch their own; a bug can still
  escape): recorded as above, then the app's handler for ``Exception`` answers it if no response started,
  and it is raised again to the server, as Starlette's ``ServerErrorMiddleware`` does. The stack's other
  handlers are for ``HTTPException`` and request-validation errors, which these routes never raise.

What the stack does that these requests do not need: route matching (the path *is* the route), dependency
solving (the functions take the ``Request`` only), the exit stacks (nothing registers on them), the body
limit (FastAPI's is off; the route enforces its own), FastAPI's telemetry (only with a global OpenTelemetry
provider, and then the request takes the stack, see below).

Every other request, and these whenever the app is not as this was written for, goes through FastAPI
(:meth:`DirectRoutes.route_for` returns None): another method (a 405 from FastAPI), a ``root_path``, debug
mode, FastAPI's native telemetry enabled (a global OpenTelemetry provider: FastAPI would make its own span),
or a middleware list other than the one this was checked against (``HttpMetricsMiddleware`` alone): a
middleware added later must see these requests, so they take the stack. The routes stay FastAPI routes, so
the OpenAPI document describes them as before. ``tests/serving/test_direct_routes.py`` compares both ways
byte for byte.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from exporters.serving.http_metrics import (
    EXCLUDED_HANDLERS,
    HttpMetrics,
    HttpMetricsMiddleware,
    content_length,
    excluded,
)

Endpoint = Callable[[Request], Awaitable[Response]]
"""A route function: the request in, the response to call out."""


class DirectRoutes:
    """The generation routes served from the app's ``__call__``; see the module docstring."""

    __slots__ = ("_app", "_http", "_middleware", "_routes")

    def __init__(self, app: FastAPI, http: HttpMetrics, routes: Mapping[str, Endpoint]) -> None:
        self._app = app
        self._http = http
        self._middleware = list(app.user_middleware)
        classes: list[object] = [m.cls for m in self._middleware]
        if classes != [HttpMetricsMiddleware]:
            raise ValueError("DirectRoutes reproduces HttpMetricsMiddleware alone; check any other middleware")
        # (endpoint, whether the HTTP metrics observe it: the middleware's exclusions searched in the template)
        patterns: Sequence[str] = self._middleware[0].kwargs.get("excluded", EXCLUDED_HANDLERS)  # type: ignore[assignment]
        self._routes = {path: (endpoint, not excluded(path, patterns)) for path, endpoint in routes.items()}

    def route_for(self, scope: Scope) -> tuple[Endpoint, bool] | None:
        """The route serving this HTTP scope here, None when it must go through FastAPI."""
        route = self._routes.get(scope["path"])
        if route is None or scope["method"] != "POST" or scope.get("root_path"):
            return None
        app: Any = self._app
        if app.root_path or app.debug or app.user_middleware != self._middleware:
            return None
        telemetry = getattr(app, "_native_telemetry", None)  # FastAPI's own (private): absent where FastAPI has none
        if telemetry is not None and telemetry.enabled():
            return None
        return route

    async def serve(self, route: tuple[Endpoint, bool], scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request on ``route`` (from :meth:`route_for`)."""
        endpoint, observed = route
        scope["app"] = self._app
        start = time.perf_counter()
        started = False
        status = 500
        response_bytes = 0

        async def send_and_watch(message: Message) -> None:
            nonlocal started, status, response_bytes
            if message["type"] == "http.response.start":
                started = True
                status = int(message["status"])
                response_bytes = content_length(message.get("headers", ()))
            await send(message)

        try:
            try:
                response = await endpoint(Request(scope, receive, send_and_watch))
                await response(scope, receive, send_and_watch)
            finally:
                if observed:
                    self._http.observe(
                        scope["method"],
                        status,
                        scope["path"],
                        max(time.perf_counter() - start, 0.0),
                        content_length(scope.get("headers", ())),
                        response_bytes,
                    )
        except Exception as exc:
            await self._unexpected(exc, started, scope, receive, send)
            raise

    async def _unexpected(self, exc: Exception, started: bool, scope: Scope, receive: Receive, send: Send) -> None:
        """What Starlette's ServerErrorMiddleware does with an exception, short of raising it again."""
        if started:
            return
        handler = self._app.exception_handlers.get(Exception) or self._app.exception_handlers.get(500)
        if handler is None:
            response: Response = Response("Internal Server Error", status_code=500, media_type="text/plain")
        else:
            response = await handler(Request(scope), exc)  # type: ignore[misc]
        await response(scope, receive, send)
