"""The openai proxy engine in front of a real upstream server (a loadlens server on a scripted engine)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.tracing import Tracing
from tests.serving.fakes import ScriptedEngine
from tests.support import required
from tests.support.server import free_port, raw_stream, serve_app

CHAT = "/v1/chat/completions"


@dataclass
class Chain:
    proxy_url: str
    upstream_url: str
    upstream: ScriptedEngine
    proxy_registry: CollectorRegistry


@pytest.fixture
def chain() -> Iterator[Chain]:
    upstream = ScriptedEngine()
    up_app = create_app(upstream, ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    with serve_app(up_app) as up_url:
        registry = CollectorRegistry()
        proxy_app = create_app(
            OpenAIProxyEngine(up_url), ServeSettings(), registry=registry, tracing=Tracing.disabled()
        )
        with serve_app(proxy_app) as proxy_url:
            yield Chain(proxy_url, up_url, upstream, registry)


def _chat(**extra: object) -> dict[str, object]:
    return {"model": "scripted", "messages": [{"role": "user", "content": "hello there"}], **extra}


def _events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]


def test_stream_is_forwarded_chunk_for_chunk(chain: Chain) -> None:
    direct = _events(httpx.post(chain.upstream_url + CHAT, json=_chat(max_tokens=3, stream=True)).text)
    proxied = _events(httpx.post(chain.proxy_url + CHAT, json=_chat(max_tokens=3, stream=True)).text)
    assert len(proxied) == len(direct) == 5  # role, 3 tokens, [DONE]
    strip = [{k: v for k, v in json.loads(e).items() if k not in ("id", "created")} for e in direct[:-1]]
    got = [{k: v for k, v in json.loads(e).items() if k not in ("id", "created")} for e in proxied[:-1]]
    assert got == strip  # usage the proxy asked for upstream is stripped again
    assert proxied[-1] == "[DONE]"


def test_usage_forwarded_when_client_asks(chain: Chain) -> None:
    opts = {"include_usage": True}
    events = _events(
        httpx.post(chain.proxy_url + CHAT, json=_chat(max_tokens=2, stream=True, stream_options=opts)).text
    )
    last = json.loads(events[-2])
    assert last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}
    assert sum(1 for e in events[:-1] if "usage" in json.loads(e)) == 1


def test_non_stream_through_proxy_and_openai_client(chain: Chain) -> None:
    body = httpx.post(chain.proxy_url + CHAT, json=_chat(max_tokens=3)).json()
    assert body["choices"][0]["message"]["content"] == "t1 t2 t3 "
    assert body["usage"]["completion_tokens"] == 3
    openai = required.require_module("openai")
    client = openai.OpenAI(base_url=chain.proxy_url + "/v1", api_key="x")
    stream = client.completions.create(model="scripted", prompt="a b", max_tokens=2, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "t1 t2 "
    assert [m.id for m in client.models.list()] == ["scripted"]


def test_upstream_status_and_body_are_forwarded(chain: Chain) -> None:
    r = httpx.post(chain.proxy_url + CHAT, json={**_chat(), "model": "nope"})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "The model `nope` does not exist."
    chain.upstream.max_active = 0
    r = httpx.post(chain.proxy_url + CHAT, json=_chat())
    assert r.status_code == 429
    assert r.headers["retry-after"] == "2"
    # Client mistakes caught at the proxy never reach the upstream.
    assert httpx.post(chain.proxy_url + CHAT, json=_chat(n=3)).status_code == 400


def test_metrics_at_the_proxy(chain: Chain) -> None:
    for _ in range(2):
        httpx.post(chain.proxy_url + CHAT, json=_chat(max_tokens=4, stream=True))
    ia = {"model_name": "scripted", "priority_class": "interactive"}
    assert chain.proxy_registry.get_sample_value("loadlens_output_tokens_total", ia) == 8
    g = {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "openai",
        "gen_ai_request_model": "scripted",
        "priority_class": "interactive",
    }
    assert chain.proxy_registry.get_sample_value("gen_ai_server_time_to_first_token_seconds_count", g) == 2
    assert (
        chain.proxy_registry.get_sample_value("gen_ai_server_token_usage_sum", {**g, "gen_ai_token_type": "input"}) == 6
    )


def test_disconnect_at_proxy_aborts_upstream(chain: Chain) -> None:
    chain.upstream.itl_s = 0.05
    with raw_stream(chain.proxy_url, CHAT, _chat(max_tokens=300, stream=True), until=b"t1"):
        pass
    deadline = time.monotonic() + 30
    while not chain.upstream.aborted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(chain.upstream.aborted) == 1
    assert chain.upstream.active == set()


def test_unreachable_upstream_is_503() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    app = create_app(OpenAIProxyEngine(dead), ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    with serve_app(app) as url:
        r = httpx.post(url + CHAT, json=_chat())
        assert r.status_code == 503
        assert "unreachable" in r.json()["error"]["message"]
        assert httpx.get(url + "/health").status_code == 503


def test_upstream_status_whose_body_is_cut_off_is_forwarded_not_a_500() -> None:
    """The upstream sends its error status, then drops the connection before the promised body."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    answered = threading.Event()

    def upstream() -> None:
        models = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()
        while not answered.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the test closed the listener
            with conn:
                head = conn.recv(65536)
                if head.startswith(b"GET /v1/models"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(models), models))  # fmt: skip
                    continue
                conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 400\r\n\r\n{\"error\": ")  # fmt: skip
                answered.set()

    thread = threading.Thread(target=upstream, daemon=True)
    thread.start()
    up = f"http://127.0.0.1:{listener.getsockname()[1]}"
    app = create_app(OpenAIProxyEngine(up), ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    try:
        with serve_app(app) as url:
            r = httpx.post(url + CHAT, json=_chat(), timeout=10)
        assert answered.is_set()
        assert r.status_code == 500
        assert r.json()["error"]["message"] == "upstream returned HTTP 500"
    finally:
        listener.close()
        thread.join(timeout=5)


def test_the_proxy_answers_501_for_the_responses_api(chain: Chain) -> None:
    """The proxy declares it cannot serve /v1/responses (it forwards chat and completions verbatim); the
    upstream is never asked."""
    r = httpx.post(chain.proxy_url + "/v1/responses", json={"model": "scripted", "input": "hi"})
    assert r.status_code == 501
    assert r.json()["error"]["message"] == "the openai engine does not serve /v1/responses; call the upstream's own"
    assert chain.upstream.last_request is None


def test_proxy_rejects_bad_upstream_url() -> None:
    with pytest.raises(ValueError, match="http"):
        OpenAIProxyEngine("ftp://example")


def test_upstream_error_translation() -> None:
    from exporters.serving.engine import ErrorKind
    from exporters.serving.engines.openai.errors import upstream_error

    body = b'{"error": {"message": "too long", "type": "BadRequestError", "param": "max_tokens", "code": 400}}'
    err = upstream_error("http://u:1", 400, raw=body, content_type="application/json")
    assert (err.kind, err.status, err.message, err.retry_after_seconds) == (ErrorKind.UPSTREAM, 400, "too long", None)
    assert (err.body, err.content_type) == (body, "application/json")  # the upstream's bytes, not re-serialised
    err = upstream_error("http://u:1", 429, raw=b"slow down", retry_after="2.5")
    assert (err.status, err.message, err.body, err.retry_after_seconds) == (
        429,
        "upstream returned HTTP 429: slow down",
        None,
        2.5,
    )
    assert upstream_error("http://u:1", 503, raw=b"", retry_after="soon").retry_after_seconds is None
    err = upstream_error("http://u:1", ConnectionRefusedError("refused"))
    assert (err.kind, err.status, err.message) == (
        ErrorKind.UNAVAILABLE,
        None,
        "upstream http://u:1 unreachable: refused",
    )
    err = upstream_error("http://u:1", "upstream stream broke: reset")
    assert (err.kind, err.status, err.message, err.body) == (
        ErrorKind.UPSTREAM,
        502,
        "upstream stream broke: reset",
        None,
    )


def test_trace_context_reaches_the_upstream(chain: Chain) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    r = httpx.post(chain.proxy_url + CHAT, json=_chat(max_tokens=2, stream=True), headers=headers)
    assert r.status_code == 200
    seen = chain.upstream.last_request
    assert seen is not None and seen.trace_headers is not None
    assert seen.trace_headers["traceparent"].split("-")[1] == trace_id  # the upstream joined the client's trace


def test_upstream_connections_are_bounded_by_max_connections() -> None:
    upstream = ScriptedEngine(itl_s=0.02)
    upstream.hold = threading.Event()  # every request stays active upstream until the test has seen two at once
    up_app = create_app(upstream, ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    with serve_app(up_app) as up_url:
        proxy = OpenAIProxyEngine(up_url, max_connections=2)
        app = create_app(proxy, ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
        with serve_app(app) as url:
            results: list[int] = []
            most = 0

            def one() -> None:
                results.append(httpx.post(url + CHAT, json=_chat(max_tokens=10, stream=True), timeout=60).status_code)

            threads = [threading.Thread(target=one) for _ in range(6)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            while len(upstream.active) < 2:
                most = max(most, len(upstream.active))
                assert time.monotonic() < deadline, f"{len(upstream.active)} requests reached the upstream"
                time.sleep(0.005)
            # Both connections are taken and held; the other four requests can only wait in the proxy. Keep
            # holding a while so that a proxy that opened more connections would show it.
            hold_until = time.monotonic() + 0.3
            while time.monotonic() < hold_until:
                most = max(most, len(upstream.active))
                time.sleep(0.005)
            upstream.hold.set()
            while any(t.is_alive() for t in threads):
                most = max(most, len(upstream.active))
                time.sleep(0.005)
    assert results == [200] * 6  # the others waited in the proxy for a free connection
    assert most == 2
