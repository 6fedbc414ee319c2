"""OpenAI-style error bodies with the status codes and ``type`` names vLLM's server uses.

Body shape (vLLM 0.33 ``ErrorResponse``)::

    {"error": {"message": "...", "type": "BadRequestError", "param": "max_tokens", "code": 400}}

Shared by every loadlens HTTP server that answers JSON errors (the serving layer, the pager), so a client
sees one error shape whichever it talks to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

TYPE_BY_STATUS: Mapping[int, str] = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def error_type(status: int) -> str:
    """The OpenAI ``type`` for a status; unlisted ones fall back by class (4xx client, 5xx server)."""
    return TYPE_BY_STATUS.get(status, "BadRequestError" if status < 500 else "InternalServerError")


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": status}}


def error_response(
    status: int, message: str, param: str | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        json.dumps(error_body(status, message, param)),
        status_code=status,
        media_type="application/json",
        headers=dict(headers or {}),
    )
