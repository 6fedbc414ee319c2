"""The one table from a refusal to its HTTP status and reason label, and the responses built from it."""

from __future__ import annotations

import json

import pytest

from exporters.serving.engine import EngineError, ErrorKind
from exporters.serving.errors import (
    BY_KIND,
    REFUSALS,
    REJECT_REASONS,
    UNAUTHORIZED,
    engine_error_reason,
    engine_error_response,
    engine_error_status,
    sse_error_event,
)


def test_every_error_kind_has_exactly_one_row() -> None:
    kinds = [r.kind for r in REFUSALS if r.kind is not None]
    assert sorted(kinds) == sorted(ErrorKind)
    assert len(set(REJECT_REASONS)) == len(REFUSALS)


def test_table_values_are_the_served_ones() -> None:
    # The rejection series are seeded in this order; statuses are vLLM's.
    assert [(r.reason, r.status) for r in REFUSALS] == [
        ("invalid_request", 400),
        ("unknown_model", 404),
        ("queue_full", 429),
        ("unavailable", 503),
        ("unauthorized", 401),
        ("upstream_error", 500),
        ("internal", 500),
    ]
    assert UNAUTHORIZED.kind is None
    assert BY_KIND[ErrorKind.NOT_FOUND].reason == "unknown_model"


@pytest.mark.parametrize(
    ("err", "status", "reason"),
    [
        (EngineError(ErrorKind.INVALID_REQUEST, "x"), 400, "invalid_request"),
        (EngineError(ErrorKind.NOT_FOUND, "x"), 404, "unknown_model"),
        (EngineError(ErrorKind.QUEUE_FULL, "x"), 429, "queue_full"),
        (EngineError(ErrorKind.UNAVAILABLE, "x"), 503, "unavailable"),
        (EngineError(ErrorKind.INTERNAL, "x"), 500, "internal"),
        (EngineError(ErrorKind.UPSTREAM, "x", status=418), 418, "upstream_error"),
        (EngineError(ErrorKind.UPSTREAM, "x"), 500, "upstream_error"),
        (EngineError(ErrorKind.INVALID_REQUEST, "x", status=418), 400, "invalid_request"),  # status: UPSTREAM only
    ],
)
def test_engine_error_status_and_reason(err: EngineError, status: int, reason: str) -> None:
    assert engine_error_status(err) == status
    assert engine_error_reason(err) == reason


def test_engine_error_response_forwards_upstream_body_and_rounds_retry_after() -> None:
    body = b'{"error":{"message":"upstream says no","type":"X","param":null,"code":429}}'
    r = engine_error_response(EngineError(ErrorKind.UPSTREAM, "m", status=429, body=body, retry_after_seconds=0.2))
    assert r.status_code == 429
    assert r.body == body  # byte for byte: the upstream's separators, not json.dumps's
    assert (r.headers["retry-after"], r.headers["content-type"]) == ("1", "application/json")
    r = engine_error_response(
        EngineError(ErrorKind.UPSTREAM, "m", status=400, body=body, content_type="application/problem+json")
    )
    assert (r.body, r.headers["content-type"]) == (body, "application/problem+json")
    r = engine_error_response(EngineError(ErrorKind.QUEUE_FULL, "full", param="p", retry_after_seconds=2.6))
    assert json.loads(r.body) == {"error": {"message": "full", "type": "RateLimitError", "param": "p", "code": 429}}
    assert r.headers["retry-after"] == "3"
    assert "retry-after" not in engine_error_response(EngineError(ErrorKind.INTERNAL, "boom")).headers


def test_sse_error_event_bytes() -> None:
    assert sse_error_event(502, "broke") == (
        b'data: {"error": {"message": "broke", "type": "BadGatewayError", "param": null, "code": 502}}\n\n'
    )
