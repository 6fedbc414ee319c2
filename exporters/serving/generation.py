"""A generation request, from its body to the response that runs it: what ``POST /v1/chat/completions``,
``POST /v1/completions`` and ``POST /v1/responses`` share (app.py routes them here), and the state every route
shares (:class:`ServingState`).

Read, parsed and validated (``protocol.py``), counted from arrival to its end (``lifecycle.py``), handed to the
engine, and answered by :class:`~exporters.serving.streaming.GenerationResponse`; a bug or an engine crash before
the response started is a counted, logged 500 with the trace id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request
from prometheus_client import CollectorRegistry
from starlette.responses import Response

from exporters.serving.adapters import AdapterRegistry
from exporters.serving.engine import Endpoint, Engine, EngineError, GenerationRequest
from exporters.serving.errors import (
    INTERNAL,
    INVALID_REQUEST,
    engine_error_reason,
    engine_error_response,
    internal_error_response,
)
from exporters.serving.lifecycle import RequestLifecycle
from exporters.serving.metrics import OVERFLOW_MODEL, ServingMetrics
from exporters.serving.protocol import ParsedRequest, RequestError, parse_generation, parse_json_body
from exporters.serving.protocol_fast import parse_forwarded_common
from exporters.serving.request_log import LogFormat, RequestLogger
from exporters.serving.streaming import GenerationResponse, admit_unless_client_leaves
from exporters.serving.tracing import Tracing, extract_context, new_request_id, parse_traceparent
from loadlens import __version__
from loadlens.contracts.slo import SLOConfig, load_slos
from loadlens.util.openai_errors import error_response

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Image data URLs make bodies large; beyond this a request is refused with 413 before parsing."""


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


async def read_json(request: Request) -> dict[str, Any]:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise TooLarge()
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise TooLarge()
    return parse_json_body(raw)


CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


_ROUTE_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH, "/v1/responses"})


def _path(request: Request) -> str:
    """``request.url.path`` (the scope's path, escaped as a URL's), without building the URL for the generation
    routes' own paths, which are that string already."""
    path: str = request.scope["path"]
    return path if path in _ROUTE_PATHS else request.url.path


class TooLarge(Exception):
    """A request body over :data:`MAX_BODY_BYTES`."""


Parse = Callable[[dict[str, Any]], ParsedRequest]


async def generate(
    state: ServingState,
    request: Request,
    endpoint: Endpoint,
    parse: Parse | None = None,
    respond: type[GenerationResponse] = GenerationResponse,
) -> Response:
    arrival = time.monotonic()
    request_id = new_request_id()
    path = _path(request)
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
            path=path,
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
        return internal_error_response(exc, life.trace_id, f"POST {path}")


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
        body = await read_json(request)
        if parse is not None:
            parsed = parse(body)
        else:
            forwarded = state.engine.forwards_upstream_errors
            common = parse_forwarded_common(endpoint, body) if forwarded else None  # the same, without pydantic
            parsed = common or parse_generation(endpoint, body, forwarded=forwarded)
    except TooLarge:
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
