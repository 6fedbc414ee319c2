"""The request body's JSON reading (exporters/serving/protocol.py ``_loads``, one decoder made once) gives what
``json.loads(raw, parse_constant=_no_constant)`` gives: the same document, or the same error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from exporters.serving import protocol

BODIES = [
    b'{"model": "m", "prompt": "hi", "max_tokens": 4, "stream": true}',
    b'{"a": [1, 2.5, -0.0, 1e400, null, false], "b": {"c": "\\u00e9\\ud83d\\ude00"}}',
    b'{"lone": "\\ud800"}',
    b"\xef\xbb\xbf" + b'{"bom": 1}',
    '{"utf16": "é"}'.encode("utf-16"),
    '{"utf32": 1}'.encode("utf-32-le"),
    b'{"x": NaN}',
    b'{"x": -Infinity}',
    b'{"x": 1',
    b"",
    b"[1, 2]",
    b'"just a string"',
    b'{"bad": "\xff"}',
    b'{"a": 1} trailing',
    bytearray(b'{"ba": 2}'),
]


def _outcome(fn: Any, raw: bytes) -> object:
    try:
        return ("ok", fn(raw))
    except Exception as err:  # the same error both ways is what is compared
        return (type(err).__name__, str(err))


@pytest.mark.parametrize("raw", BODIES)
def test_loads_is_json_loads_with_no_constants(raw: bytes) -> None:
    expected = _outcome(lambda r: json.loads(r, parse_constant=protocol._no_constant), raw)
    assert _outcome(protocol._loads, raw) == expected
    assert repr(_outcome(protocol._loads, raw)) == repr(expected)  # -0.0, inf, key order alike
