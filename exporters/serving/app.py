"""The OpenAI-compatible HTTP layer (FastAPI on uvicorn), engine-agnostic.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``, ``GET /v1/models``,
``GET /health``, ``GET /metrics``, ``POST /v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter``,
``GET|PATCH /admin/knobs``, ``GET /sim/device-state``, and ``GET /openapi.json`` documenting them all
(:mod:`exporters.serving.openapi`). Every error is an OpenAI-style JSON body; a client mistake is never a
500, and a bug is a counted, logged 500 with the trace id. See docs/serving.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from exporters.serving.adapters import AdapterRegistry, resolve_adapter_path
from exporters.serving.direct_body import SERVER_SEND
from exporters.serving.direct_routes import DirectRoutes
from exporters.serving.engine import (
    Endpoint,
    Engine,
    EngineError,
    ErrorKind,
    GenerationRequest,
)
from exporters.serving.errors import (
    INTERNAL,
    INVALID_REQUEST,
    UNAUTHORIZED,
    engine_error_reason,
    engine_error_response,
    internal_error_response,
)
from exporters.serving.http_metrics import install_http_metrics
from exporters.serving.lifecycle import RequestLifecycle
from exporters.serving.metrics import OVERFLOW_MODEL, ServingMetrics
from exporters.serving.openapi import ROUTE_DOCS, install_openapi
from exporters.serving.protocol import (
    ParsedRequest,
    RequestError,
    parse_generation,
    parse_json_body,
    parse_load_adapter,
    parse_unload_adapter,
)
from exporters.serving.request_log import LogFormat, RequestLogger
from exporters.serving.responses_api import ResponsesAPIResponse, parse_responses_request
from exporters.serving.streaming import GenerationResponse, admit_unless_client_leaves
from exporters.serving.tracing import Tracing, extract_context, new_trace_id, parse_traceparent
from loadlens import __version__
from loadlens.contracts.device_state import DEVICE_STATE_PATH
from loadlens.contracts.slo import SLOConfig, load_slos
from loadlens.util.exposition import render as render_exposition
from loadlens.util.openai_errors import error_response

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Image data URLs make bodies large; beyond this a request is refused with 413 before parsing."""


def guard(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """A route handler that answers an unexpected exception with a logged OpenAI 500 itself, so Starlette's
    error middleware never prints a bare traceback (generation requests also count it, in ``_generate``)."""

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


@dataclass(frozen=True, slots=True)
class ServeSettings:
    admin_token: str | None = None
    lora_root: Path | None = None
    log_format: LogFormat = "logfmt"
    slos: SLOConfig | None = None


class ServingState:
    """Everything the routes share: the engine, metrics, tracing, adapters, served names."""

    def __init__(
        self, engine: Engine, settings: ServeSettings, registry: CollectorRegistry, tracing: Tracing | None
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.registry = registry
        self.slos = settings.slos or load_slos()
        self.metrics = ServingMetrics(registry, self.slos, engine.name, __version__)
        self.tracing = tracing or Tracing.from_env(
            __version__, lambda reason, n: self.metrics.spans_dropped.labels(reason).inc(n)
        )
        self.logger = RequestLogger(settings.log_format)
        self.adapters = AdapterRegistry()
        self.base_model = ""
        self.served: set[str] = set()
        self.adapter_lock = asyncio.Lock()

    async def refresh_models(self) -> None:
        cards = await self.engine.models()
        if cards and not self.base_model:
            self.base_model = cards[0].id
        self.served = {c.id for c in cards}
        for name in self.served:
            self.metrics.seed_model(name)


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


async def _read_json(request: Request) -> dict[str, Any]:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise _TooLarge()
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise _TooLarge()
    return parse_json_body(raw)


CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class _TooLarge(Exception):
    pass


Parse = Callable[[dict[str, Any]], ParsedRequest]


async def _generate(
    state: ServingState,
    request: Request,
    endpoint: Endpoint,
    parse: Parse | None = None,
    respond: type[GenerationResponse] = GenerationResponse,
) -> Response:
    arrival = time.monotonic()
    request_id = uuid.uuid4().hex
    headers = request.headers
    parent_ids = parse_traceparent(headers.get("traceparent"))
    tracer = state.tracing.tracer
    parent_ctx = extract_context(headers) if (tracer is not None and parent_ids) else None

    lives: list[RequestLifecycle] = []

    def early_life(model: str, priority: int, stream: bool) -> RequestLifecycle:
        life = RequestLifecycle.start(
            metrics=state.metrics,
            logger=state.logger,
            tracer=tracer,
            parent=parent_ctx,
            parent_ids=parent_ids,
            request_id=request_id,
            path=request.url.path,
            endpoint=endpoint,
            requested_model=model,
            model_label=model if model in state.served else OVERFLOW_MODEL,
            priority=priority,
            priority_class=state.slos.class_for_priority(priority),
            stream=stream,
            arrival=arrival,
        )
        lives.append(life)
        return life

    try:
        return await _generate_inner(state, request, endpoint, arrival, request_id, early_life, parse, respond)
    except Exception as exc:
        # A bug in loadlens or an engine crash before the response started: counted as code="500" with the
        # request log line and span, then logged with its traceback under the same trace id.
        life = lives[-1] if lives else early_life(state.base_model, 0, False)
        life.reject(500, INTERNAL.reason, f"internal error: {type(exc).__name__}: {exc}")
        return internal_error_response(exc, life.trace_id, f"POST {request.url.path}")


async def _generate_inner(
    state: ServingState,
    request: Request,
    endpoint: Endpoint,
    arrival: float,
    request_id: str,
    early_life: Callable[[str, int, bool], RequestLifecycle],
    parse: Parse | None,
    respond: type[GenerationResponse],
) -> Response:
    default_class = state.slos.class_for_priority(0)
    try:
        body = await _read_json(request)
        if parse is not None:
            parsed = parse(body)
        else:
            parsed = parse_generation(endpoint, body, forwarded=state.engine.forwards_upstream_errors)
    except _TooLarge:
        life = early_life(state.base_model, 0, False)
        life.reject(413, INVALID_REQUEST.reason, f"request body larger than {MAX_BODY_BYTES} bytes")
        return error_response(413, f"request body larger than {MAX_BODY_BYTES} bytes")
    except RequestError as err:
        life = early_life(state.base_model, 0, False)
        life.cls = default_class
        life.reject(INVALID_REQUEST.status, INVALID_REQUEST.reason, err.message)
        return error_response(INVALID_REQUEST.status, err.message, err.param)

    model = parsed.model or state.base_model
    life = early_life(model, parsed.priority, parsed.stream)
    life.set_request_attributes(parsed.sampling.max_tokens, parsed.sampling.temperature, parsed.sampling.seed)
    lora = state.adapters.get(model)
    gen = GenerationRequest(
        request_id=request_id,
        endpoint=endpoint,
        model=model,
        prompt=parsed.prompt,
        image_count=parsed.image_count,
        sampling=parsed.sampling,
        arrival_time=arrival,
        priority=parsed.priority,
        lora=lora,
        trace_headers={"traceparent": f"00-{life.trace_id}-{life.span_id}-01"},
        body=parsed.body,
        stream_requested=parsed.stream,
    )
    try:
        if parsed.stream:
            stream = await state.engine.generate(gen)
        else:
            admitted = await admit_unless_client_leaves(request.receive, state.engine.generate(gen), life.admit)
            if admitted is None:
                life.finish_abort("client_disconnect", None)
                return Response(status_code=499)  # nobody reads it: the client has gone
            stream = admitted
    except EngineError as err:
        response = engine_error_response(err)
        life.withdraw()
        life.reject(response.status_code, engine_error_reason(err), err.message)
        return response
    except asyncio.CancelledError:
        if life.admitted:  # in flight while the engine admitted it: never left counted
            life.finish_abort("shutdown", None)
        raise
    if not life.admitted:
        life.admit()
    return respond(life, stream, parsed, model)


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
        return await _generate(state, request, "chat")

    @app.post(COMPLETIONS_PATH, **ROUTE_DOCS[f"POST {COMPLETIONS_PATH}"])
    async def completions(request: Request) -> Response:
        return await _generate(state, request, "completions")

    # The same two functions, guarded as every route is, also served below the FastAPI stack.
    app.direct = DirectRoutes(app, http_metrics, {CHAT_PATH: guard(chat), COMPLETIONS_PATH: guard(completions)})

    @app.post("/v1/responses", **ROUTE_DOCS["POST /v1/responses"])
    async def responses(request: Request) -> Response:
        if not engine.supports_responses_api:
            # A forwarding engine (the proxy) passes chat and completions on verbatim; it does not translate
            # the Responses API.
            detail = f"the {engine.name} engine does not serve /v1/responses; call the upstream's own"
            return error_response(501, detail)
        return await _generate(state, request, "chat", parse_responses_request, ResponsesAPIResponse)

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
        except _TooLarge:
            return error_response(413, "request body too large")
        except RequestError as err:
            return error_response(INVALID_REQUEST.status, err.message, err.param)
        except EngineError as err:
            return engine_error_response(err)

    @app.post("/v1/load_lora_adapter", **ROUTE_DOCS["POST /v1/load_lora_adapter"])
    async def load_lora_adapter(request: Request) -> Response:
        async def action() -> Response:
            body = parse_load_adapter(await _read_json(request))
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
            name = parse_unload_adapter(await _read_json(request))
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
            changes = await _read_json(request)
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
