"""The OpenAI-style error body shared by the serving layer and the pager."""

from __future__ import annotations

import json

import pytest

from loadlens.util.openai_errors import error_body, error_response, error_type


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, "BadRequestError"),
        (401, "AuthenticationError"),
        (404, "NotFoundError"),
        (413, "RequestTooLargeError"),
        (429, "RateLimitError"),
        (500, "InternalServerError"),
        (502, "BadGatewayError"),
        (503, "ServiceUnavailableError"),
        (418, "BadRequestError"),  # unlisted 4xx
        (599, "InternalServerError"),  # unlisted 5xx
    ],
)
def test_type_by_status(status: int, expected: str) -> None:
    assert error_type(status) == expected


def test_body_shape() -> None:
    assert error_body(400, "too long", "max_tokens") == {
        "error": {"message": "too long", "type": "BadRequestError", "param": "max_tokens", "code": 400}
    }
    assert error_body(503, "down") == {
        "error": {"message": "down", "type": "ServiceUnavailableError", "param": None, "code": 503}
    }


def test_response_carries_status_headers_and_body() -> None:
    r = error_response(401, "no token", headers={"WWW-Authenticate": "Bearer"})
    assert r.status_code == 401
    assert r.media_type == "application/json"
    assert r.headers["www-authenticate"] == "Bearer"
    assert json.loads(r.body) == {
        "error": {"message": "no token", "type": "AuthenticationError", "param": None, "code": 401}
    }
