"""OpenAI-style error responses with the status codes vLLM's server uses.

Body shape (vLLM 0.33 ``ErrorResponse``)::

    {"error": {"message": "...", "type": "BadRequestError", "param": "max_tokens", "code": 400}}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from exporters.serving.engine import EngineError, ErrorKind

_TYPE_BY_STATUS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}

STATUS_BY_KIND = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.QUEUE_FULL: 429,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = _TYPE_BY_STATUS.get(status, "BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(
    status: int, message: str, param: str | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        json.dumps(error_body(status, message, param)),
        status_code=status,
        media_type="application/json",
        headers=dict(headers or {}),
    )


def engine_error_status(err: EngineError) -> int:
    if err.kind is ErrorKind.UPSTREAM and err.status is not None:
        return err.status
    return STATUS_BY_KIND.get(err.kind, 500)


def engine_error_response(err: EngineError) -> Response:
    status = engine_error_status(err)
    headers: dict[str, str] = {}
    if err.retry_after_seconds is not None:
        # Retry-After is whole seconds; never 0, which clients read as "immediately, in a tight loop".
        headers["Retry-After"] = str(max(1, round(err.retry_after_seconds)))
    if err.body is not None:
        return Response(json.dumps(err.body), status_code=status, media_type="application/json", headers=headers)
    return error_response(status, err.message, err.param, headers)


def sse_error_event(status: int, message: str) -> bytes:
    """An error delivered inside an already-started stream (vLLM sends the error object as a data event)."""
    return b"data: " + json.dumps(error_body(status, message)).encode() + b"\n\n"
