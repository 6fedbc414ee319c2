"""The proxy against upstreams that close connections: a request that provably never reached the upstream
(sent on a kept-alive connection the upstream had closed as idle) is sent again and counted; a request the
upstream received is never sent twice; and every failure the proxy answers for itself is counted by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.engines.openai.errors import FAILURE_REASONS, RETRY_REASONS
from exporters.serving.tracing import Tracing
from tests.serving.fakes import ScriptedEngine
from tests.support.server import free_port, serve_app

pytestmark = pytest.mark.slow  # real sockets, a uvicorn each and hundreds of requests: seconds each

COMPLETIONS = "/v1/completions"
BODY = {"model": "fake", "prompt": "hello", "max_tokens": 3, "stream": True}
Mode = Literal["ok", "close_after_request", "cut_stream"]


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class FakeUpstream:
    """A bare-socket HTTP/1.1 upstream, one thread per connection.

    ``close_idle``: once the test sets it, a kept-alive connection that has answered before is closed when its
    next request arrives, unanswered: the race an upstream's keep-alive timer wins against a client that picked
    the connection just before the close reached it (the request is dropped unprocessed, as a real idle close
    drops it), made to happen on every reused connection at the moment the test chooses.
    ``mode`` for completions on the connection they arrive on: ``ok`` streams 3 tokens; ``close_after_request``
    reads the request and closes without a byte of answer (a server that failed it); ``cut_stream`` sends the
    head and one token, then closes.
    """

    def __init__(self, *, mode: Mode = "ok") -> None:
        self.close_idle = threading.Event()
        self.mode = mode
        self.received: Counter[str] = Counter()  # requests read, by method
        self.served = 0  # completions answered in full
        self.stale_closed: Counter[str] = Counter()  # requests dropped by the idle close, by method
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._listener.close()
        self._thread.join(timeout=5)

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
            answered = 0
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                method, path = head.split(b" ", 2)[:2]
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                with self._lock:
                    if answered and self.close_idle.is_set():
                        self.stale_closed[method.decode()] += 1
                        return  # closed unanswered: the request is dropped unprocessed
                    self.received[method.decode()] += 1
                if not self._answer(conn, method, path):
                    return
                answered += 1

    def _answer(self, conn: socket.socket, method: bytes, path: bytes) -> bool:
        """Answer one request; False when the connection is to be closed."""
        if method == b"GET":
            doc = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode()
            keep = self.mode == "ok"  # the failure modes get their completions on a fresh connection
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                         % (len(doc), b"" if keep else b"Connection: close\r\n", doc))  # fmt: skip
            return keep
        if self.mode == "close_after_request":
            return False
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        tokens = 1 if self.mode == "cut_stream" else 3
        for i in range(1, tokens + 1):
            finish = b'"length"' if i == 3 else b"null"
            payload = b'{"id":"c","object":"text_completion","model":"fake","choices":[{"index":0,"text":"t%d ",' \
                      b'"logprobs":null,"finish_reason":%s}]}' % (i, finish)  # fmt: skip
            conn.sendall(_chunk(b"data: " + payload + b"\n\n"))
        if self.mode == "cut_stream":
            return False
        usage = b'{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}}'
        conn.sendall(_chunk(b"data: " + usage + b"\n\n") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        with self._lock:
            self.served += 1
        return True


@contextlib.contextmanager
def _proxy(upstream_url: str, registry: CollectorRegistry) -> Iterator[str]:
    engine = OpenAIProxyEngine(upstream_url, registry=registry)
    app = create_app(engine, ServeSettings(), registry=registry, tracing=Tracing.disabled())
    with serve_app(app) as url:
        yield url


def _counts(registry: CollectorRegistry, name: str, reasons: tuple[str, ...]) -> dict[str, float | None]:
    return {r: registry.get_sample_value(name, {"reason": r}) for r in reasons}


def _no_failures() -> dict[str, float | None]:
    return dict.fromkeys(FAILURE_REASONS, 0.0)


async def _wave(url: str, n: int) -> list[tuple[int, str]]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def one() -> tuple[int, str]:
            r = await client.post(COMPLETIONS, json=BODY)
            return r.status_code, r.text

        return await asyncio.gather(*(one() for _ in range(n)))


def _tokens(text: str) -> str:
    return "".join(
        json.loads(line[6:])["choices"][0]["text"]
        for line in text.split("\n\n")
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )


def test_requests_on_connections_the_upstream_closed_as_idle_are_sent_again_and_counted() -> None:
    up = FakeUpstream()
    registry = CollectorRegistry()
    try:
        with _proxy(up.url, registry) as url:
            first = asyncio.run(_wave(url, 16))  # opens the proxy's pooled connections
            up.close_idle.set()  # from now on the upstream drops the next request on each of them unanswered
            second = asyncio.run(_wave(url, 16))
    finally:
        up.close()
    assert [status for status, _ in first + second] == [200] * 32
    assert {_tokens(text) for _, text in first + second} == {"t1 t2 t3 "}
    stale = up.stale_closed["POST"]
    assert stale > 0  # the pooled connections the second wave picked were all closed under it
    assert _counts(registry, "loadlens_proxy_upstream_retries_total", RETRY_REASONS) == {
        "stale_connection": stale,
        "connect": 0.0,
    }
    assert _counts(registry, "loadlens_proxy_upstream_failures_total", FAILURE_REASONS) == _no_failures()
    assert (up.received["POST"], up.served) == (32, 32)  # each request processed exactly once


def test_a_request_the_upstream_received_is_not_sent_again() -> None:
    up = FakeUpstream(mode="close_after_request")
    registry = CollectorRegistry()
    try:
        with _proxy(up.url, registry) as url:
            r = httpx.post(url + COMPLETIONS, json=BODY, timeout=30)
    finally:
        up.close()
    assert r.status_code == 502
    assert r.json()["error"]["message"].startswith(f"upstream {up.url} closed the connection without answering")
    assert up.received["POST"] == 1
    assert _counts(registry, "loadlens_proxy_upstream_retries_total", RETRY_REASONS) == {
        "stale_connection": 0.0,
        "connect": 0.0,
    }
    assert _counts(registry, "loadlens_proxy_upstream_failures_total", FAILURE_REASONS) == {
        **_no_failures(),
        "connection_closed": 1.0,
    }
    assert registry.get_sample_value("loadlens_requests_total", {"model_name": "fake", "priority_class": "interactive",
                                                                 "code": "502"}) == 1  # fmt: skip


def test_a_stream_the_upstream_cut_short_is_not_sent_again() -> None:
    up = FakeUpstream(mode="cut_stream")
    registry = CollectorRegistry()
    try:
        with _proxy(up.url, registry) as url:
            r = httpx.post(url + COMPLETIONS, json=BODY, timeout=30)
    finally:
        up.close()
    assert r.status_code == 200
    events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["text"] == "t1 "
    assert json.loads(events[1])["error"]["code"] == 502
    assert events[2:] == ["[DONE]"]
    assert up.received["POST"] == 1
    assert registry.get_sample_value("loadlens_proxy_upstream_retries_total", {"reason": "stale_connection"}) == 0
    assert _counts(registry, "loadlens_proxy_upstream_failures_total", FAILURE_REASONS) == {
        **_no_failures(),
        "stream_broken": 1.0,
    }


def test_unreachable_upstream_is_retried_then_503_counted_as_connect() -> None:
    registry = CollectorRegistry()
    with _proxy(f"http://127.0.0.1:{free_port()}", registry) as url:
        r = httpx.post(url + COMPLETIONS, json=BODY, timeout=30)
    assert r.status_code == 503
    assert registry.get_sample_value("loadlens_proxy_upstream_retries_total", {"reason": "connect"}) == 2
    assert _counts(registry, "loadlens_proxy_upstream_failures_total", FAILURE_REASONS) == {
        **_no_failures(),
        "connect": 1.0,
    }


@pytest.mark.timeout(120)
def test_no_503_against_a_real_uvicorn_closing_idle_connections_under_concurrency() -> None:
    """A real uvicorn upstream whose keep-alive timeout (50 ms) expires while the proxy's clients pause about
    as long between requests: every request succeeds and the upstream serves each exactly once, however often
    the close races a request (the invariant; the race itself is forced in the test with ``close_idle``)."""
    upstream = ScriptedEngine(ttft_s=0.002, itl_s=0.001)
    up_registry = CollectorRegistry()
    up_app = create_app(upstream, ServeSettings(), registry=up_registry, tracing=Tracing.disabled())
    keep_alive: Any = 0.05  # typed int, used as a loop.call_later delay: a float works
    registry = CollectorRegistry()
    users, per_user = 48, 8
    body = {"model": "scripted", "prompt": "hello", "max_tokens": 3, "stream": True}
    # serve_app binds the port itself (a number from free_port could be taken before uvicorn binds it, and
    # uvicorn's exit in its thread then left this test waiting for `started` until its timeout).
    with serve_app(up_app, timeout_keep_alive=keep_alive) as up_url, _proxy(up_url, registry) as url:

        async def load() -> list[int]:
            limits = httpx.Limits(max_connections=users, max_keepalive_connections=users)
            async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
                rng = random.Random(7)

                async def user() -> list[int]:
                    codes = []
                    for _ in range(per_user):
                        await asyncio.sleep(rng.uniform(0.03, 0.07))
                        codes.append((await client.post(COMPLETIONS, json=body)).status_code)
                    return codes

                return [c for codes in await asyncio.gather(*(user() for _ in range(users))) for c in codes]

        codes = asyncio.run(load())
    assert Counter(codes) == {200: users * per_user}
    ok = {"model_name": "scripted", "priority_class": "interactive", "code": "200"}
    assert up_registry.get_sample_value("loadlens_requests_total", ok) == users * per_user  # none served twice
    assert _counts(registry, "loadlens_proxy_upstream_failures_total", FAILURE_REASONS) == _no_failures()
    # How often the race happened depends on the scheduler (18 and 63 times in two runs on a 2-core host, 0 in
    # another): only the invariant is asserted here. The test above makes it happen on every reused connection.
    retries = registry.get_sample_value("loadlens_proxy_upstream_retries_total", {"reason": "stale_connection"})
    assert retries is not None and retries >= 0
