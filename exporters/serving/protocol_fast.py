"""The common body of a request a forwarding engine (the proxy) serves, read without pydantic: the
:class:`~exporters.serving.protocol.ParsedRequest` that :func:`~exporters.serving.protocol.parse_forwarded_request`
returns for it, or None for anything else, which that function reads (and refuses, with its errors).

Common: the required field (``messages`` or ``prompt``) present; ``model`` absent, null or a string; ``stream``
absent, null or a boolean; when streaming, ``stream_options`` absent, or an object whose ``include_usage`` and
``continuous_usage_stats`` are absent, null or booleans; each of ``max_tokens`` (and ``max_completion_tokens``
for chat), ``temperature``, ``seed`` and ``priority`` absent, null, or of its exact type within its bounds (an
integer; a finite float for ``temperature``). Exact types only: whatever pydantic would convert (a float
``max_tokens``, an integer ``temperature``) or refuse goes the other way, so both give the same result.
``tests/serving/test_protocol_fast.py`` compares the two over every shape.
"""

from __future__ import annotations

import math
from typing import Any

from exporters.serving.engine import Endpoint, SamplingParams
from exporters.serving.protocol import INT64_MAX, INT64_MIN, MAX_TOKENS_LIMIT, ParsedRequest

_NONE = type(None)
_FLAGS = (bool, _NONE)


def _int(value: Any, low: int, high: int) -> tuple[bool, int | None]:
    """(read, value): an absent or null value reads as None, an int within bounds as itself; anything else is
    not read here."""
    if value is None:
        return True, None
    if type(value) is int and low <= value <= high:
        return True, value
    return False, None


def parse_forwarded_common(endpoint: Endpoint, body: dict[str, Any]) -> ParsedRequest | None:
    """``parse_forwarded_request(endpoint, body)`` for the common body (module docstring), else None."""
    if ("messages" if endpoint == "chat" else "prompt") not in body:
        return None
    model = body.get("model")
    stream = body.get("stream")
    if type(model) not in (str, _NONE) or type(stream) not in _FLAGS:
        return None
    stream = bool(stream)
    include_usage = continuous = False
    if stream and "stream_options" in body:
        options = body["stream_options"]
        if options is not None:
            if type(options) is not dict:
                return None
            usage, every = options.get("include_usage"), options.get("continuous_usage_stats")
            if type(usage) not in _FLAGS or type(every) not in _FLAGS:
                return None
            include_usage, continuous = bool(usage), bool(every)
    max_tokens: int | None = None
    if endpoint == "chat":
        read, max_tokens = _int(body.get("max_completion_tokens"), 1, MAX_TOKENS_LIMIT)
        if not read:
            return None
    if max_tokens is None:
        read, max_tokens = _int(body.get("max_tokens"), 1, MAX_TOKENS_LIMIT)
        if not read:
            return None
    temperature = body.get("temperature")
    if temperature is not None and not (type(temperature) is float and math.isfinite(temperature)):
        return None
    read_seed, seed = _int(body.get("seed"), INT64_MIN, INT64_MAX)
    read_priority, priority = _int(body.get("priority"), INT64_MIN, INT64_MAX)
    if not (read_seed and read_priority):
        return None
    return ParsedRequest(
        endpoint=endpoint,
        model=model,
        prompt="",
        image_count=0,
        sampling=SamplingParams(
            max_tokens=max_tokens or 0, temperature=1.0 if temperature is None else temperature, seed=seed
        ),
        stream=stream,
        include_usage=include_usage,
        continuous_usage_stats=continuous,
        priority=priority or 0,
        body=body,
    )
