"""exporters/serving/generation.py's shortcuts give what they replace."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from exporters.serving.generation import _path


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/a b?c#d", "/x\\y"]
)
@pytest.mark.parametrize("query", [b"", b"a=1"])
@pytest.mark.parametrize("host", [None, b"example.com:8000"])
def test_path_is_the_request_urls_path(path: str, query: bytes, host: bytes | None) -> None:
    headers = [(b"host", host)] if host is not None else []
    scope = {
        "type": "http", "method": "POST", "path": path, "root_path": "", "scheme": "http",
        "server": ("127.0.0.1", 8000), "query_string": query, "headers": headers,
    }  # fmt: skip
    assert _path(Request(scope)) == Request(scope).url.path
