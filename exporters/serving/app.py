"""The OpenAI-compatible HTTP layer (FastAPI on uvicorn), engine-agnostic.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``, ``GET /v1/models``,
``GET /health``, ``GET /metrics``, ``POST /v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter``,
``GET|PATCH /admin/knobs``, ``GET /sim/device-state``, and ``GET /openapi.json`` documenting them all
(:mod:`exporters.serving.openapi`). Every error is an OpenAI-style JSON body; a client mistake is never a
500, and a bug is a counted, logged 500 with the trace id. See docs/serving.md.
"""

from __future__ import annotations

import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from exporters.serving.adapters import resolve_adapter_path
from exporters.serving.direct_body import SERVER_SEND
from exporters.serving.direct_routes import DirectRoutes
from exporters.serving.engine import (
    Engine,
    EngineError,
    ErrorKind,
)
from exporters.serving.errors import (
    INVALID_REQUEST,
    UNAUTHORIZED,
    engine_error_response,
    internal_error_response,
)
from exporters.serving.generation import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    ServeSettings,
    ServingState,
    TooLarge,
    generate,
    read_json,
)
from exporters.serving.http_metrics import install_http_metrics
from exporters.serving.metrics import OVERFLOW_MODEL
from exporters.serving.openapi import ROUTE_DOCS, install_openapi
from exporters.serving.protocol import (
    RequestError,
    parse_load_adapter,
    parse_unload_adapter,
)
from exporters.serving.responses_api import ResponsesAPIResponse, parse_responses_request
from exporters.serving.tracing import Tracing, new_trace_id, parse_traceparent
from loadlens import __version__
from loadlens.contracts.device_state import DEVICE_STATE_PATH
from loadlens.util.exposition import render as render_exposition
from loadlens.util.openai_errors import error_response

__all__ = ["ServeSettings", "create_app", "guard"]


def guard(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """A route handler that answers an unexpected exception with a logged OpenAI 500 itself, so Starlette's
    error middleware never prints a bare traceback (generation requests also count it, in ``generation.generate``)."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except (StarletteHTTPException, RequestValidationError):
            raise
        except Exception as exc:
            ids = parse_traceparent(request.headers.get("traceparent"))
            return internal_error_response(
                exc, ids[0] if ids else new_trace_id(), f"{request.method} {request.url.path}"
            )

    return guarded


class _Route(APIRoute):
    """Every route's handler is guarded (:func:`guard`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return guard(super().get_route_handler())


class _ServingApp(FastAPI):
    """Keeps the server's own ``send`` in each HTTP scope, before middleware wraps it: streamed chunks from
    a socket-reading engine are written below the middleware (exporters/serving/direct_body.py says when).
    Generation requests are served from here, below the FastAPI stack, with its effects
    (exporters/serving/direct_routes.py)."""

    direct: DirectRoutes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[SERVER_SEND] = send
            direct = self.direct
            route = direct.route_for(scope) if direct is not None else None
            if route is not None:
                await direct.serve(route, scope, receive, send)  # type: ignore[union-attr]
                return
        await super().__call__(scope, receive, send)


def _check_admin(state: ServingState, request: Request) -> Response | None:
    token = state.settings.admin_token
    if not token:
        return None
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        # Admin calls name no served model: counted under the base model, which the server runs.
        model = state.base_model if state.base_model in state.served else OVERFLOW_MODEL
        state.metrics.rejections.labels(state.metrics.model_label(model), UNAUTHORIZED.reason).inc()
        return error_response(
            UNAUTHORIZED.status, "missing or invalid admin bearer token", headers={"WWW-Authenticate": "Bearer"}
        )
    return None


@contextlib.asynccontextmanager
async def _adapter_op(state: ServingState, operation: str) -> AsyncIterator[None]:
    """Count a runtime adapter load/unload by outcome and time the successful ones."""
    started = time.monotonic()
    try:
        yield
    except EngineError:
        state.metrics.adapter_ops.labels(operation, "error").inc()
        raise
    state.metrics.adapter_ops.labels(operation, "success").inc()
    state.metrics.adapter_op_duration.labels(operation).observe(time.monotonic() - started)


def create_app(
    engine: Engine,
    settings: ServeSettings | None = None,
    *,
    registry: CollectorRegistry | None = None,
    tracing: Tracing | None = None,
) -> FastAPI:
    """Build the app around an engine. The engine is started and stopped with the app's lifespan."""
    settings = settings or ServeSettings()
    state = ServingState(engine, settings, registry or CollectorRegistry(), tracing)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        await state.refresh_models()
        try:
            yield
        finally:
            await engine.stop()
            state.tracing.shutdown()

    app = _ServingApp(title="loadlens serve", version=__version__, lifespan=lifespan)
    app.state.serving = state
    app.router.route_class = _Route
    http_metrics = install_http_metrics(app, state.registry)  # vLLM's API-server http_* series, every engine

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = "Not Found" if exc.status_code == 404 else str(exc.detail)
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # Starlette names only the first matching route's methods; GET and PATCH /admin/knobs are two.
            headers["Allow"] = ", ".join(_allowed_methods(app, request))
        return error_response(exc.status_code, message, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = first.get("loc", ())
        param = str(loc[-1]) if loc else None
        return error_response(400, f"{param}: {first.get('msg', 'invalid value')}", param)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        # Only what escapes the routes' own guard (middleware); still logged with a trace id.
        ids = parse_traceparent(request.headers.get("traceparent"))
        return internal_error_response(exc, ids[0] if ids else new_trace_id(), f"{request.method} {request.url.path}")

    @app.post(CHAT_PATH, **ROUTE_DOCS[f"POST {CHAT_PATH}"])
    async def chat(request: Request) -> Response:
        return await generate(state, request, "chat")

    @app.post(COMPLETIONS_PATH, **ROUTE_DOCS[f"POST {COMPLETIONS_PATH}"])
    async def completions(request: Request) -> Response:
        return await generate(state, request, "completions")

    # The same two functions, guarded as every route is, also served below the FastAPI stack.
    app.direct = DirectRoutes(app, http_metrics, {CHAT_PATH: guard(chat), COMPLETIONS_PATH: guard(completions)})

    @app.post("/v1/responses", **ROUTE_DOCS["POST /v1/responses"])
    async def responses(request: Request) -> Response:
        if not engine.supports_responses_api:
            # A forwarding engine (the proxy) passes chat and completions on verbatim; it does not translate
            # the Responses API.
            detail = f"the {engine.name} engine does not serve /v1/responses; call the upstream's own"
            return error_response(501, detail)
        return await generate(state, request, "chat", parse_responses_request, ResponsesAPIResponse)

    @app.get("/v1/models", **ROUTE_DOCS["GET /v1/models"])
    async def models() -> Response:
        cards = await engine.models()
        created = int(time.time())
        data: list[dict[str, Any]] = [
            {
                "id": c.id,
                "object": "model",
                "created": created,
                "owned_by": c.owned_by,
                "root": c.root or c.id,
                "parent": c.parent,
                "max_model_len": c.max_model_len,
                "permission": [],
            }
            for c in cards
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/health", **ROUTE_DOCS["GET /health"])
    async def health() -> Response:
        h = await engine.health()
        if h.ok:
            return JSONResponse({"status": "ok", "engine": engine.name})
        return error_response(503, f"engine unavailable: {h.detail}")

    @app.get("/metrics", **ROUTE_DOCS["GET /metrics"])
    async def metrics(request: Request) -> Response:
        body, content_type = render_exposition(state.registry, request.headers.get("accept"))
        return Response(body, media_type=content_type)

    async def _admin(request: Request, action: Callable[[], Awaitable[Response]]) -> Response:
        denied = _check_admin(state, request)
        if denied is not None:
            return denied
        try:
            return await action()
        except TooLarge:
            return error_response(413, "request body too large")
        except RequestError as err:
            return error_response(INVALID_REQUEST.status, err.message, err.param)
        except EngineError as err:
            return engine_error_response(err)

    @app.post("/v1/load_lora_adapter", **ROUTE_DOCS["POST /v1/load_lora_adapter"])
    async def load_lora_adapter(request: Request) -> Response:
        async def action() -> Response:
            body = parse_load_adapter(await read_json(request))
            path = resolve_adapter_path(settings.lora_root, body.lora_path)
            async with state.adapter_lock:
                if body.lora_name in state.adapters or body.lora_name == state.base_model:
                    raise RequestError(f"The lora adapter '{body.lora_name}' has already been loaded.", "lora_name")
                lora = state.adapters.make(body.lora_name, path)
                async with _adapter_op(state, "load"):
                    await engine.load_adapter(lora)
                    state.adapters.add(lora)
                    await state.refresh_models()
            return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type="text/plain")

        return await _admin(request, action)

    @app.post("/v1/unload_lora_adapter", **ROUTE_DOCS["POST /v1/unload_lora_adapter"])
    async def unload_lora_adapter(request: Request) -> Response:
        async def action() -> Response:
            name = parse_unload_adapter(await read_json(request))
            async with state.adapter_lock, _adapter_op(state, "unload"):
                if name not in state.adapters:
                    raise EngineError(
                        ErrorKind.NOT_FOUND, f"The lora adapter '{name}' cannot be found.", param="lora_name"
                    )
                await engine.unload_adapter(name)
                state.adapters.remove(name)
                await state.refresh_models()
            return Response(f"Success: LoRA adapter '{name}' removed successfully.", media_type="text/plain")

        return await _admin(request, action)

    @app.get("/admin/knobs", **ROUTE_DOCS["GET /admin/knobs"])
    async def get_knobs(request: Request) -> Response:
        async def action() -> Response:
            return JSONResponse({"engine": engine.name, "knobs": engine.knobs()})

        return await _admin(request, action)

    @app.patch("/admin/knobs", **ROUTE_DOCS["PATCH /admin/knobs"])
    async def patch_knobs(request: Request) -> Response:
        async def action() -> Response:
            changes = await read_json(request)
            if not changes:
                raise RequestError("send a JSON object of knob names to new values", None)
            knobs = await engine.set_knobs(changes)
            return JSONResponse({"engine": engine.name, "knobs": knobs})

        return await _admin(request, action)

    @app.get(DEVICE_STATE_PATH, **ROUTE_DOCS[f"GET {DEVICE_STATE_PATH}"])
    async def device_state(
        since_us: int = Query(0, ge=0, le=2**63 - 1, description="only samples after this many microseconds"),
    ) -> Response:
        doc = engine.device_state(since_us)
        if doc is None:
            return error_response(404, f"engine '{engine.name}' has no simulated device")
        return JSONResponse(doc)

    install_openapi(app, forwards_upstream_errors=engine.forwards_upstream_errors)
    return app


def _allowed_methods(app: FastAPI, request: Request) -> list[str]:
    methods: set[str] = set()
    for route in app.routes:
        if isinstance(route, APIRoute) and route.methods and route.path_regex.match(request.url.path):
            methods |= route.methods
    return sorted(methods)
