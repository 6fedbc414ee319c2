"""The served OpenAPI document (``GET /openapi.json``), truthful for every route: request bodies from the
pydantic models that validate them (:mod:`exporters.serving.protocol`), every status a route answers with
its body schema and media type, and errors as the OpenAI error object (400 where FastAPI would say 422).

FastAPI generates the paths from the routes; :func:`install_openapi` then replaces each operation's request
body and responses with the ones declared here, so the document and the server share one definition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema

from exporters.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    LoadLoRAAdapterRequest,
    UnloadLoRAAdapterRequest,
)
from exporters.serving.responses_api import ResponsesRequest
from loadlens.contracts.device_state import DEVICE_STATE_PATH, DeviceState
from loadlens.util.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE

_REF = "#/components/schemas/{model}"


# --- response models (documentation only: the routes build these bodies directly) ------------------------


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorInfo(_Open):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(_Open):
    """vLLM's and OpenAI's error body."""

    error: ErrorInfo


class PromptTokensDetails(_Open):
    cached_tokens: int | None = None


class Usage(_Open):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int | None = None
    prompt_tokens_details: PromptTokensDetails | None = None


class ChatMessageOut(_Open):
    role: str
    content: str | None = None


class ChatChoice(_Open):
    index: int
    message: ChatMessageOut
    finish_reason: str | None = None


class ChatCompletion(_Open):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class CompletionChoice(_Open):
    index: int
    text: str
    finish_reason: str | None = None


class Completion(_Open):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ResponseOutputText(_Open):
    type: Literal["output_text"]
    text: str


class ResponseMessage(_Open):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    status: str
    content: list[ResponseOutputText]


class ResponsesUsage(_Open):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class ResponseObject(_Open):
    """``POST /v1/responses`` when not streaming (the OpenAI Responses API object)."""

    id: str
    object: Literal["response"]
    created_at: int
    model: str
    status: Literal["completed", "incomplete"]
    output: list[ResponseMessage]
    usage: ResponsesUsage


class ModelCard(_Open):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(_Open):
    object: Literal["list"]
    data: list[ModelCard]


class Health(_Open):
    status: Literal["ok"]
    engine: str


class Knobs(_Open):
    engine: str
    knobs: dict[str, Any]


class KnobChanges(_Open):
    """Knob names to new values, applied all or none (``GET /admin/knobs`` lists them)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"minProperties": 1})


_MODELS: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest,
    CompletionRequest,
    ResponsesRequest,
    LoadLoRAAdapterRequest,
    UnloadLoRAAdapterRequest,
    KnobChanges,
    ResponseObject,
    ErrorResponse,
    ChatCompletion,
    Completion,
    ModelList,
    Health,
    Knobs,
    DeviceState,
)


# --- per-operation documentation --------------------------------------------------------------------------


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _text(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}


_ERRORS: Mapping[int, str] = {
    400: "invalid request: malformed JSON, wrong types, out-of-range values, context overflow (`param` names the "
    "field)",
    401: "admin bearer token missing or wrong (only when one is configured)",
    404: "unknown model or adapter",
    413: "request body over 64 MiB",
    429: "the engine's waiting queue is full (`Retry-After` header)",
    500: "a bug in loadlens or an engine crash; never a client mistake",
    501: "the engine does not serve this route (the openai proxy and /v1/responses)",
    503: "engine unavailable or upstream unreachable",
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): _json(ErrorResponse, _ERRORS[s]) for s in statuses}


def _body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(model)}}}


_SSE_EVENT: dict[str, Any] = {
    "description": "one server-sent event (OpenAPI 3.1: `schema` describes each event of the stream)",
    "type": "object",
    "properties": {
        "data": {
            "type": "string",
            "description": 'a chunk object as JSON (`chat.completion.chunk`, `text_completion`), an `{"error": ...}` '
            "object after a failure, or `[DONE]` last",
        },
        "event": {"type": "string"},
    },
    "required": ["data"],
}
_GENERATION_ERRORS = (400, 404, 413, 429, 500, 503)
_ADMIN_ERRORS = (400, 401, 404, 413, 429, 500, 503)


def _generation(model: type[BaseModel], response: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": _body(model),
        "responses": {
            "200": {
                "description": "the whole response (`stream` false) or an SSE stream of chunks ending `data: [DONE]`",
                "content": {
                    "application/json": {"schema": _ref(response)},
                    "text/event-stream": {"schema": _SSE_EVENT},
                },
            },
            **_errors(*_GENERATION_ERRORS),
        },
    }


_RESPONSES_EVENT: dict[str, Any] = {
    "description": "one server-sent event: `event` is the type (`response.created` ... `response.completed`), "
    "`data` the event object as JSON",
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["data"],
}


def _responses() -> dict[str, Any]:
    return {
        "requestBody": _body(ResponsesRequest),
        "responses": {
            "200": {
                "description": "the response object (`stream` false) or the Responses API event stream",
                "content": {
                    "application/json": {"schema": _ref(ResponseObject)},
                    "text/event-stream": {"schema": _RESPONSES_EVENT},
                },
            },
            **_errors(*_GENERATION_ERRORS, 501),
        },
    }


OPERATIONS: Mapping[str, dict[str, Any]] = {
    "POST /v1/chat/completions": _generation(ChatCompletionRequest, ChatCompletion),
    "POST /v1/completions": _generation(CompletionRequest, Completion),
    "POST /v1/responses": _responses(),
    "GET /v1/models": {"responses": {"200": _json(ModelList, "the base model and loaded adapters"), **_errors(500)}},
    "GET /health": {"responses": {"200": _json(Health, "the engine is up"), **_errors(500, 503)}},
    "GET /metrics": {
        "responses": {
            "200": {
                "description": "Prometheus text format; OpenMetrics (with exemplars) when `Accept` asks for it",
                "content": {
                    TEXT_CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}},
                    OPENMETRICS_CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}},
                },
            },
            **_errors(500),
        }
    },
    "POST /v1/load_lora_adapter": {
        "requestBody": _body(LoadLoRAAdapterRequest),
        "responses": {"200": _text("vLLM's success message"), **_errors(*_ADMIN_ERRORS)},
    },
    "POST /v1/unload_lora_adapter": {
        "requestBody": _body(UnloadLoRAAdapterRequest),
        "responses": {"200": _text("vLLM's success message"), **_errors(*_ADMIN_ERRORS)},
    },
    "GET /admin/knobs": {"responses": {"200": _json(Knobs, "the engine's runtime knobs"), **_errors(401, 500)}},
    "PATCH /admin/knobs": {
        "requestBody": _body(KnobChanges),
        "responses": {"200": _json(Knobs, "the knobs after the change"), **_errors(*_ADMIN_ERRORS)},
    },
    f"GET {DEVICE_STATE_PATH}": {
        "responses": {
            "200": _json(DeviceState, "the device-state document"),
            **_errors(400, 500),
            "404": _json(ErrorResponse, "the engine has no simulated device"),
        }
    },
}

ROUTE_DOCS: Mapping[str, dict[str, Any]] = {
    key: {"summary": key.split(" ", 1)[1], "operation_id": key.replace(" /", "_").replace("/", "_").replace("-", "_")}
    for key in OPERATIONS
}
"""Keyword arguments for each route's decorator (summary, operation id); the rest is :data:`OPERATIONS`."""


_FORWARDED = {
    "description": "through the openai engine: the upstream's own status and error body, forwarded unchanged",
    "content": {"application/json": {"schema": {"type": "object"}}},
}
_FORWARDING_ROUTES = frozenset(
    {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/load_lora_adapter", "POST /v1/unload_lora_adapter"}
)


def build_openapi(app: FastAPI, *, forwards_upstream_errors: bool = False) -> dict[str, Any]:
    """The document of ``app``'s routes; ``forwards_upstream_errors`` (the engine's capability of that name) adds
    a ``default`` response, the upstream's own status and body, to the generation and LoRA routes."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes, description=app.description)
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            key = f"{method.upper()} {path}"
            declared = OPERATIONS.get(key)
            if declared is None:
                raise ValueError(f"route {key} has no entry in exporters/serving/openapi.py")
            operation.pop("requestBody", None)
            operation.update(json.loads(json.dumps(declared)))  # a copy: the table is shared by every app
            if forwards_upstream_errors and key in _FORWARDING_ROUTES:
                operation["responses"]["default"] = _FORWARDED
    _, defs = models_json_schema([(m, "validation") for m in _MODELS], ref_template=_REF)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas.update(defs.get("$defs", {}))
    return doc


def install_openapi(app: FastAPI, *, forwards_upstream_errors: bool = False) -> None:
    """Serve :func:`build_openapi`'s document (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, forwards_upstream_errors=forwards_upstream_errors)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
