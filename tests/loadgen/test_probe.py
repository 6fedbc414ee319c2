"""GET /v1/models: the first base model, and one clear line for every way the target can be unusable."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadgen.probe import TargetUnreachable, first_model, models_url
from loadlens.util.net import free_port


class Answer:
    status = 200
    body = b""
    seen: list[tuple[str, str | None]] = []


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        Answer.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(Answer.status)
        self.send_header("Content-Length", str(len(Answer.body)))
        self.end_headers()
        self.wfile.write(Answer.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Answer.seen = []
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def answer(status: int, doc: object) -> None:
    Answer.status = status
    Answer.body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()


def test_models_url_accepts_v1_and_keeps_a_prefix() -> None:
    assert models_url("http://h:1") == "http://h:1/v1/models"
    assert models_url("http://h:1/v1/") == "http://h:1/v1/models"
    assert models_url("http://h:1/proxy/v1") == "http://h:1/proxy/v1/models"


def test_first_base_model_and_the_bearer_token(server: str) -> None:
    answer(200, {"data": [{"id": "lora-a", "parent": "base"}, {"id": "base"}, {"id": "other"}]})
    assert first_model(server + "/v1", "k") == "base"
    assert Answer.seen == [("/v1/models", "Bearer k")]
    answer(200, {"data": [{"id": "lora-a", "parent": "base"}]})
    assert first_model(server) == "lora-a"  # only adapters listed: the first one
    assert Answer.seen[-1] == ("/v1/models", None)


@pytest.mark.parametrize(
    ("status", "doc", "message"),
    [
        (404, {"detail": "no"}, "target {url} answered GET /v1/models with HTTP 404"),
        (204, b"", "target {url} answered GET /v1/models with HTTP 204"),
        (200, b"<html>", "target {url}: /v1/models is not JSON"),
        (200, {"data": []}, "target {url} lists no models at /v1/models"),
        (200, ["not", "a", "mapping"], "target {url} lists no models at /v1/models"),
    ],
)
def test_unusable_answers(server: str, status: int, doc: object, message: str) -> None:
    answer(status, doc)
    with pytest.raises(TargetUnreachable) as err:
        first_model(server)
    assert str(err.value) == message.format(url=server)


def test_nothing_listening() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TargetUnreachable) as err:
        first_model(url, timeout=2.0)
    assert str(err.value) == f"cannot reach target {url}: [Errno 111] Connection refused"
