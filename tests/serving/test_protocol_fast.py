"""``parse_forwarded_common`` (exporters/serving/protocol_fast.py) gives ``parse_forwarded_request``'s result for
every body it reads, and leaves every other body (the refused ones included) to it."""

from __future__ import annotations

import random
from typing import Any

import pytest

from exporters.serving.protocol import RequestError, parse_forwarded_request
from exporters.serving.protocol_fast import parse_forwarded_common

ABSENT = object()
VALUES: dict[str, list[Any]] = {
    "model": [ABSENT, None, "m", "", 5, ["m"]],
    "stream": [ABSENT, None, True, False, "true", 1, 0],
    "stream_options": [ABSENT, None, {}, {"include_usage": True},
                       {"include_usage": None, "continuous_usage_stats": True}, {"include_usage": False, "extra": [1]},
                       {"include_usage": "yes"}, {"continuous_usage_stats": 1}, [], "x"],
    "max_tokens": [ABSENT, None, 1, 0, 16, 2**31 - 1, 2**31, -3, 5.0, "5", True],
    "max_completion_tokens": [ABSENT, None, 8, 0, 2.0, False],
    "temperature": [ABSENT, None, 0.7, 0.0, -1.5, 0, 1, float("nan"), float("inf"), "0.5", True],
    "seed": [ABSENT, None, 7, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 1.0, True, "3"],
    "priority": [ABSENT, None, 0, -5, 2**63, 2.5, False],
}  # fmt: skip
REQUIRED = {"chat": ("messages", [{"role": "user", "content": "hi"}]), "completions": ("prompt", "hi")}


def _outcome(endpoint: str, body: dict[str, Any]) -> object:
    try:
        return parse_forwarded_request(endpoint, body)  # type: ignore[arg-type]
    except RequestError as err:
        return ("refused", err.message, err.param)


def _bodies(endpoint: str) -> list[dict[str, Any]]:
    """The base body, each field's every value alone, and 3,000 random combinations, with and without the
    required field."""
    key, value = REQUIRED[endpoint]
    base = {key: value, "model": "m", "stream": True, "max_tokens": 16}
    bodies = [dict(base)]
    for name, values in VALUES.items():
        for v in values:
            body = {k: x for k, x in base.items() if k != name}
            if v is not ABSENT:
                body[name] = v
            bodies.append(body)
    rng = random.Random(21)
    for _ in range(3000):
        body = {key: value} if rng.random() < 0.95 else {}
        for name, values in VALUES.items():
            v = rng.choice(values)
            if v is not ABSENT:
                body[name] = v
        bodies.append(body)
    return bodies


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_the_common_body_reads_as_the_validated_one(endpoint: str) -> None:
    read = 0
    for body in _bodies(endpoint):
        common = parse_forwarded_common(endpoint, body)  # type: ignore[arg-type]
        if common is not None:
            read += 1
            assert common == _outcome(endpoint, body), body
            assert common.body is body
    # The common shapes among these seeded bodies, each compared above (not a vacuous comparison).
    assert read == {"chat": 91, "completions": 106}[endpoint]


def test_the_benchmark_clients_body_is_common() -> None:
    body = {"model": "m", "prompt": "benchmark prompt " * 32, "max_tokens": 128, "ignore_eos": True, "stream": True}
    parsed = parse_forwarded_common("completions", body)
    assert parsed is not None and parsed == parse_forwarded_request("completions", body)
    assert (parsed.stream, parsed.sampling.max_tokens, parsed.include_usage, parsed.priority) == (True, 128, False, 0)
