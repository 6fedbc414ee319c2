"""Byte-level field extraction from OpenAI streaming chunks (the JSON of one SSE ``data:`` line).

``json.loads`` dominates the per-token cost of whoever reads a stream (the load generator's client, the
serving layer's proxy). These functions read the few fields they need by byte search instead, and step
aside (return None or ``NOT_COMPACT``) whenever the bytes are not the compact JSON that vLLM, OpenAI and
loadlens send, so the caller takes its json.loads path.

Why a byte search is safe on compact JSON: a key pattern such as ``"text":`` cannot occur inside a string
value, where every quote is escaped.
"""

from __future__ import annotations

import json
import re

COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')
PROMPT_TOKENS = re.compile(rb'"prompt_tokens":(\d+)')


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ABSENT, EMPTY, NON_EMPTY, NOT_COMPACT = (
    _Marker("ABSENT"),
    _Marker("EMPTY"),
    _Marker("NON_EMPTY"),
    _Marker("NOT_COMPACT"),
)


def string_start(payload: bytes, key: bytes) -> _Marker:
    """Whether ``key`` (quoted, e.g. ``b'"text"'``) holds a non-empty string, an empty one or null, is
    absent, or is not compact JSON. Looks at its first occurrence only."""
    j = payload.find(key)
    if j < 0:
        return ABSENT
    start = j + len(key)
    head = payload[start : start + 3]
    if head[:1] != b":":
        return NOT_COMPACT
    if head[1:2] == b"n":
        return EMPTY  # null
    if head[1:2] != b'"':
        return NOT_COMPACT
    return EMPTY if head == b':""' else NON_EMPTY


def fast_fields(payload: bytes, chat: bool) -> tuple[bool, bool, int | None, int | None] | None:
    """(has choices, non-empty text, completion_tokens, prompt_tokens), or None to parse the JSON.

    Non-empty text is ``content`` or ``reasoning_content`` (chat) or ``text`` (completions): what the load
    generator counts as a token for TTFT. Each of these keys occurs once per chunk; anything unusual (spaces
    after colons, an error object, no choices key) returns None.
    """
    if b'"error"' in payload:
        return None
    i = payload.find(b'"choices":')
    if i < 0 or payload[i + 10 : i + 11] != b"[":
        return None
    if payload[i + 11 : i + 12] == b"]":
        has_choices, nonempty = False, False
    else:
        has_choices = True
        value = string_start(payload, b'"content"' if chat else b'"text"')
        if value is NOT_COMPACT or (value is ABSENT and not chat):
            return None
        nonempty = value is NON_EMPTY
        if chat and not nonempty:
            reasoning = string_start(payload, b'"reasoning_content"')
            if reasoning is NOT_COMPACT:
                return None
            nonempty = reasoning is NON_EMPTY
    counts = usage_counts(payload)
    if counts is None:
        return None
    return has_choices, nonempty, counts[0], counts[1]


def usage_counts(payload: bytes) -> tuple[int | None, int | None] | None:
    """(completion_tokens, prompt_tokens), each None when absent; None when a key is there but not a
    compact non-negative integer."""
    c = COMPLETION_TOKENS.search(payload)
    if c is None and b'"completion_tokens"' in payload:
        return None
    p = PROMPT_TOKENS.search(payload)
    if p is None and b'"prompt_tokens"' in payload:
        return None
    return None if c is None else int(c.group(1)), None if p is None else int(p.group(1))


def is_null_or_absent(payload: bytes, key: bytes) -> bool | None:
    """True when ``key`` is absent or ``null``, False when it holds anything else, None when it occurs more
    than once (several choices or nested objects: parse the JSON)."""
    j = payload.find(key)
    if j < 0:
        return True
    if payload.find(key, j + len(key)) >= 0:
        return None
    start = j + len(key)
    return payload[start : start + 5] == b":null"


def string_value(payload: bytes, key: bytes) -> str | None | _Marker:
    """The decoded string ``key`` holds (once in the payload), None when absent or null, ``NOT_COMPACT``
    for anything else (another type, several occurrences, spaces, invalid escapes or UTF-8)."""
    j = payload.find(key)
    if j < 0:
        return None
    start = j + len(key)
    if payload.find(key, start) >= 0:
        return NOT_COMPACT
    head = payload[start : start + 2]
    if head == b":n":
        return None if payload[start : start + 5] == b":null" else NOT_COMPACT
    if head != b':"':
        return NOT_COMPACT
    begin = end = start + 2
    while True:
        end = payload.find(b'"', end)
        if end < 0:
            return NOT_COMPACT
        backslashes = 0
        while payload[end - 1 - backslashes] == 0x5C:  # the quote is escaped after an odd number of them
            backslashes += 1
        if backslashes % 2 == 0:
            break
        end += 1
    raw = payload[begin:end]
    try:
        if b"\\" not in raw:
            return raw.decode("utf-8")
        value = json.loads(payload[begin - 1 : end + 1])
    except ValueError:  # UnicodeDecodeError and JSONDecodeError both
        return NOT_COMPACT
    return value if isinstance(value, str) else NOT_COMPACT
