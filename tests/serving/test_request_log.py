from __future__ import annotations

import logging

import pytest

from exporters.serving.request_log import RequestLogger, format_json, format_logfmt


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"a": 1, "b": "x"}, "a=1 b=x"),
        ({"msg": "two words"}, 'msg="two words"'),
        ({"q": 'say "hi"'}, 'q="say \\"hi\\""'),
        ({"ok": True, "none": None, "ms": 1.23456}, 'ok=true none="" ms=1.235'),
        ({"empty": ""}, 'empty=""'),
        ({"nl": "a\nb"}, 'nl="a\\nb"'),
    ],
)
def test_logfmt(fields: dict[str, object], expected: str) -> None:
    assert format_logfmt(fields) == expected


def test_json_is_compact() -> None:
    assert format_json({"a": 1, "b": [1, 2]}) == '{"a":1,"b":[1,2]}'


def test_enabled_is_the_loggers_level() -> None:
    logger = logging.getLogger("loadlens.test.request_log.enabled")
    logger.setLevel(logging.WARNING)
    request_log = RequestLogger("logfmt", logger)
    assert not request_log.enabled(logging.INFO)
    assert request_log.enabled(logging.WARNING)
    logger.setLevel(logging.INFO)
    assert request_log.enabled(logging.INFO)
