"""How the serving layer refuses and fails requests: the one table from a refusal to its HTTP status and its
metrics/span reason, and the responses built from it.

The OpenAI error body itself (``type`` by status) lives in :mod:`loadlens.util.openai_errors`, shared with
the pager.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.responses import Response

from exporters.serving.engine import EngineError, ErrorKind
from loadlens.util.openai_errors import error_body, error_response


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str
    """Label value of ``loadlens_request_rejections_total{reason}``; also ``error_type`` and span ``error.type``."""
    status: int
    """HTTP status. For ``ErrorKind.UPSTREAM`` only the fallback: the upstream's own status wins."""
    kind: ErrorKind | None
    """The engine error kind it stands for; None for refusals the HTTP layer makes itself."""


# The only place a refusal gets its status and reason. Order is the series' seeding order (metrics.py).
REFUSALS: tuple[Refusal, ...] = (
    Refusal("invalid_request", 400, ErrorKind.INVALID_REQUEST),
    Refusal("unknown_model", 404, ErrorKind.NOT_FOUND),
    Refusal("queue_full", 429, ErrorKind.QUEUE_FULL),
    Refusal("unavailable", 503, ErrorKind.UNAVAILABLE),
    Refusal("unauthorized", 401, None),  # admin endpoint without the right bearer token
    Refusal("upstream_error", 500, ErrorKind.UPSTREAM),
    Refusal("internal", 500, ErrorKind.INTERNAL),
)
BY_KIND: Mapping[ErrorKind, Refusal] = {r.kind: r for r in REFUSALS if r.kind is not None}
INVALID_REQUEST = BY_KIND[ErrorKind.INVALID_REQUEST]
INTERNAL = BY_KIND[ErrorKind.INTERNAL]
UNAUTHORIZED = next(r for r in REFUSALS if r.reason == "unauthorized")
REJECT_REASONS: tuple[str, ...] = tuple(r.reason for r in REFUSALS)


def engine_error_status(err: EngineError) -> int:
    if err.kind is ErrorKind.UPSTREAM and err.status is not None:
        return err.status
    return BY_KIND[err.kind].status


def engine_error_reason(err: EngineError) -> str:
    return BY_KIND[err.kind].reason


def engine_error_response(err: EngineError) -> Response:
    status = engine_error_status(err)
    headers: dict[str, str] = {}
    if err.retry_after_seconds is not None:
        # Retry-After is whole seconds; never 0, which clients read as "immediately, in a tight loop".
        headers["Retry-After"] = str(max(1, round(err.retry_after_seconds)))
    if err.body is not None:
        # The upstream's bytes as they came: its Content-Type set here keeps Starlette from adding a charset.
        headers["content-type"] = err.content_type or "application/json"
        return Response(err.body, status_code=status, headers=headers)
    return error_response(status, err.message, err.param, headers)


def sse_error_event(status: int, message: str) -> bytes:
    """An error delivered inside an already-started stream (vLLM sends the error object as a data event)."""
    return b"data: " + json.dumps(error_body(status, message)).encode() + b"\n\n"


_log = logging.getLogger("loadlens.serve")


def internal_error_message(exc: BaseException, trace_id: str) -> str:
    return f"internal error: {type(exc).__name__} (trace_id {trace_id})"


def log_internal_error(exc: BaseException, trace_id: str, where: str) -> None:
    """A bug (never a client mistake): logged at ERROR with its traceback and the request's trace id."""
    _log.error("unexpected error in %s trace_id=%s: %s: %s", where, trace_id, type(exc).__name__, exc, exc_info=exc)


def internal_error_response(exc: BaseException, trace_id: str, where: str) -> Response:
    """Log the bug and answer it as an OpenAI 500 that names the trace id (the body never carries the detail)."""
    log_internal_error(exc, trace_id, where)
    return error_response(500, internal_error_message(exc, trace_id))
