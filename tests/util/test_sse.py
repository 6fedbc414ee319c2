"""Byte-level field extraction from OpenAI stream chunks: every answer agrees with json.loads, or steps aside."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadgen.sse import StreamParser
from loadlens.util.sse import NOT_COMPACT, fast_fields, is_null_or_absent, string_value, usage_counts

TRICKY: list[tuple[bool, dict[str, Any]]] = [
    (True, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
    (True, {"choices": [{"index": 0, "delta": {"content": None, "reasoning_content": "hm"}}]}),
    (True, {"choices": [{"index": 0, "delta": {"reasoning_content": ""}}], "usage": None}),
    (True, {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
    (
        True,
        {
            "choices": [{"delta": {"content": 'say "text":"x" and "completion_tokens":9'}}],
            "usage": {"completion_tokens": 3},
        },
    ),
    (True, {"choices": [{"delta": {"content": "\n"}}], "usage": {"prompt_tokens": 4, "completion_tokens": 12}}),
    (
        True,
        {
            "choices": [],
            "usage": {"prompt_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}, "completion_tokens": 7},
        },
    ),
    (False, {"choices": [{"index": 0, "text": ""}], "usage": {"completion_tokens": 0}}),
    (False, {"choices": [{"index": 0, "text": 'a "text":"" b'}]}),
    (False, {"choices": [{"index": 0, "text": None}]}),
]


@pytest.mark.parametrize(("chat", "obj"), TRICKY)
@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_fast_path_agrees_with_json(chat: bool, obj: dict[str, Any], separators: tuple[str, str]) -> None:
    payload = json.dumps(obj, separators=separators).encode()
    parser = StreamParser(chat=chat, start=0.0)
    slow = parser._slow_fields(payload)
    fast = fast_fields(payload, chat)
    assert slow is not None
    if separators == (",", ":"):
        assert fast == slow
    else:
        assert fast is None or fast == slow  # non-compact JSON: the byte search must step aside


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"delta":{"content":"hi"}}', "hi"),
        (b'{"delta":{"content":""}}', ""),
        (b'{"delta":{"content":null}}', None),
        (b'{"delta":{}}', None),
        (b'{"delta":{"content":"say \\"x\\" \\\\"}}', 'say "x" \\'),
        (b'{"delta":{"content":"caf\\u00e9 \xc3\xa9\\n"}}', "caf\u00e9 \u00e9\n"),
        (b'{"delta":{"content":"a\\\\"}}', "a\\"),
        (b'{"delta":{"content": "spaced"}}', NOT_COMPACT),
        (b'{"delta":{"content":["part"]}}', NOT_COMPACT),
        (b'{"delta":{"content":nope}}', NOT_COMPACT),
        (b'{"delta":{"content":"a"}},{"delta":{"content":"b"}}', NOT_COMPACT),  # twice: which choice?
        (b'{"delta":{"content":"\xff"}}', NOT_COMPACT),  # invalid UTF-8
        (b'{"delta":{"content":"\\q"}}', NOT_COMPACT),  # invalid escape
        (b'{"delta":{"content":"unterminated}}', NOT_COMPACT),
    ],
)
def test_string_value(payload: bytes, expected: object) -> None:
    value = string_value(payload, b'"content"')
    if expected is NOT_COMPACT:
        assert value is NOT_COMPACT
    else:
        assert value == expected
        if expected is not None:
            assert value == json.loads(payload.split(b'"content":', 1)[1].rsplit(b"}}", 1)[0])


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"a":1}', True),
        (b'{"finish_reason":null}', True),
        (b'{"finish_reason":"stop"}', False),
        (b'{"finish_reason":""}', False),
        (b'{"finish_reason": null}', False),
        (b'{"finish_reason":nullish}', True),  # not JSON at all: the caller validates the frame
        (b'[{"finish_reason":null},{"finish_reason":"stop"}]', None),
    ],
)
def test_is_null_or_absent(payload: bytes, expected: bool | None) -> None:
    assert is_null_or_absent(payload, b'"finish_reason"') is expected


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"usage":{"prompt_tokens":4,"completion_tokens":12}}', (12, 4)),
        (b'{"usage":{"completion_tokens":0}}', (0, None)),
        (b'{"usage":null}', (None, None)),
        (b'{"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":2}}}', (None, 4)),
        (b'{"usage":{"prompt_tokens": 4}}', None),
        (b'{"usage":{"completion_tokens":-1}}', None),
    ],
)
def test_usage_counts(payload: bytes, expected: tuple[int | None, int | None] | None) -> None:
    assert usage_counts(payload) == expected
