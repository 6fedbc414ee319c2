"""What the proxy relays unchanged: a non-streamed answer and an upstream's error body, byte for byte, and the
value checks it leaves to the upstream (docs/serving.md, *Proxy engine*). The upstream is a bare socket that
answers with scripted bytes, so any re-serialisation by the proxy shows."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.tracing import Tracing
from tests.support.server import serve_app

pytestmark = pytest.mark.slow  # real sockets and a uvicorn each

CHAT = "/v1/chat/completions"
MODELS = b'{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm","max_model_len":64}]}'
# Not json.dumps's separators, fields the OpenAI shape lacks, a null: a rebuilt body would differ.
ANSWER = (
    b'{"id":"chatcmpl-upstream","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hi there","refusal":null},"logprobs":null,'
    b'"finish_reason":"length","stop_reason":null}],"service_tier":null,"system_fingerprint":"fp-1",'
    b'"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3,'
    b'"prompt_tokens_details":{"cached_tokens":2}},"kv_transfer_params":null}'
)
REFUSAL = (
    b'{"error":{"message":"temperature must be non-negative","type":"BadRequestError","param":"temperature",'
    b'"code":400}}'
)


class ScriptedUpstream:
    """One thread per connection; ``GET /v1/models`` answers ``MODELS``, a POST answers ``(status, body)`` from
    ``answer`` (JSON, sized). ``hold``: a POST gets no answer; the test learns when the proxy closed that
    connection (``closed_unanswered``)."""

    def __init__(self, status: int = 200, body: bytes = ANSWER) -> None:
        self.answer = (status, body)
        self.hold = False
        self.posted: list[dict[str, Any]] = []
        self.closed_unanswered = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(
                    (int(v) for n, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])
                     if n.strip().lower() == b"content-length"),
                    0,
                )  # fmt: skip
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                if head.startswith(b"GET"):
                    status, payload = 200, MODELS
                else:
                    self.posted.append(json.loads(body))
                    if self.hold:
                        if not conn.recv(65536):  # the proxy closed it: its client went away
                            self.closed_unanswered.set()
                        return
                    status, payload = self.answer
                conn.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (status, len(payload), payload))  # fmt: skip


@contextlib.contextmanager
def _chain(upstream: ScriptedUpstream) -> Iterator[tuple[str, CollectorRegistry]]:
    registry = CollectorRegistry()
    engine = OpenAIProxyEngine(upstream.url, registry=registry)
    app = create_app(engine, ServeSettings(), registry=registry, tracing=Tracing.disabled())
    try:
        with serve_app(app) as url:
            yield url, registry
    finally:
        upstream.close()


def _chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, **extra}


def _count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sum(
        s.value
        for metric in registry.collect()
        for s in metric.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_a_non_streamed_answer_is_the_upstreams_body_and_is_measured_without_a_first_token() -> None:
    upstream = ScriptedUpstream()
    with _chain(upstream) as (url, registry):
        r = httpx.post(url + CHAT, json=_chat(temperature=0))
    assert (r.status_code, r.headers["content-type"], r.content) == (200, "application/json", ANSWER)
    assert upstream.posted == [_chat(temperature=0)]  # sent on as it came: not streamed, no stream_options
    assert _count(registry, "gen_ai_server_request_duration_seconds_count", error_type="") == 1
    assert _count(registry, "gen_ai_server_time_to_first_token_seconds_count") == 0  # tokens came at once
    assert _count(registry, "loadlens_inter_token_latency_seconds_count") == 0
    assert _count(registry, "gen_ai_server_token_usage_sum", gen_ai_token_type="output") == 3  # the body's usage
    assert _count(registry, "gen_ai_server_token_usage_sum", gen_ai_token_type="input") == 5
    assert _count(registry, "loadlens_output_tokens_total") == 3
    assert _count(registry, "loadlens_proxy_token_counts_total", source="usage") == 1
    assert _count(registry, "loadlens_sla_breaches_total") == 0  # no TTFT to judge, none missed
    assert _count(registry, "loadlens_goodput_requests_total") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_error_reaches_the_client_byte_for_byte(stream: bool) -> None:
    upstream = ScriptedUpstream(400, REFUSAL)
    with _chain(upstream) as (url, registry):
        r = httpx.post(url + CHAT, json=_chat(temperature=-1, stream=stream))
    assert (r.status_code, r.headers["content-type"], r.content) == (400, "application/json", REFUSAL)
    assert upstream.posted[0]["temperature"] == -1  # the upstream judged it, not the proxy
    assert _count(registry, "loadlens_request_rejections_total", reason="upstream_error") == 1
    assert _count(registry, "loadlens_requests_in_flight") == 0  # in flight while the upstream judged it


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": "m", "max_tokens": 3}, "messages"),  # nothing to forward
        (_chat(model=5), "model"),  # the served name routes adapters and labels the series
        (_chat(stream=[1]), "stream"),  # decides how the request is forwarded
        (_chat(stream=True, stream_options=[1]), "stream_options"),  # the proxy adds include_usage to it
    ],
)
def test_the_proxy_refuses_only_what_it_cannot_forward(body: dict[str, Any], param: str) -> None:
    upstream = ScriptedUpstream()
    with _chain(upstream) as (url, _):
        r = httpx.post(url + CHAT, json=body)
    assert (r.status_code, r.json()["error"]["param"], r.json()["error"]["type"]) == (400, param, "BadRequestError")
    assert upstream.posted == []


def test_value_checks_are_left_to_the_upstream() -> None:
    """Values the sim refuses itself (docs/serving.md, *Request validation*) reach the upstream unchanged."""
    upstream = ScriptedUpstream()
    odd = {"temperature": -1, "top_p": 7, "max_tokens": 0, "n": 3, "priority": "high", "stream_options": {}}
    with _chain(upstream) as (url, _):
        r = httpx.post(url + CHAT, json=_chat(**odd))
    assert (r.status_code, r.content) == (200, ANSWER)
    assert upstream.posted == [_chat(**odd)]


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_client_leaving_a_non_streamed_request_closes_the_upstream_connection() -> None:
    """The upstream holds its answer; the client leaves once the upstream has the request."""
    upstream = ScriptedUpstream()
    upstream.hold = True
    with _chain(upstream) as (url, registry):
        body = json.dumps(_chat()).encode()
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (CHAT.encode(), len(body), body))  # fmt: skip
            _until(lambda: len(upstream.posted) == 1)
            # The proxy counted it in flight before sending it on.
            assert _count(registry, "loadlens_requests_in_flight") == 1
        assert upstream.closed_unanswered.wait(30)  # vLLM aborts a request whose connection closed
        _until(lambda: _count(registry, "loadlens_request_aborts_total", reason="client_disconnect") == 1)
    assert _count(registry, "loadlens_requests_total", code="499") == 1
    assert _count(registry, "loadlens_requests_in_flight") == 0
