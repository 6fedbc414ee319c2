"""http_ok: 200 is healthy; any other answer or no answer is not."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from loadlens.util.http import http_ok
from loadlens.util.net import free_port


@pytest.fixture
def server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = {"/ok": 200, "/busy": 503, "/moved": 204}.get(self.path, 404)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_only_200_is_ok(server: str) -> None:
    assert [http_ok(server + p) for p in ("/ok", "/busy", "/moved", "/missing")] == [True, False, False, False]


def test_nothing_listening_is_not_ok() -> None:
    assert http_ok(f"http://127.0.0.1:{free_port()}/health", timeout=0.5) is False
