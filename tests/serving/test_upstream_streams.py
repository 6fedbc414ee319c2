"""The proxy in front of recorded vLLM, sglang, llama.cpp and TGI streams (tests/fixtures/upstream_streams),
replayed with their timing (a token-carrying write never before the proxy read the previous one): what the
client receives, byte for byte, and what the proxy measures."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.tracing import Tracing
from tests.fixtures.upstream_streams import Fixture, ReplayUpstream, load
from tests.support.server import serve_app

INC = {"include_usage": True}
CONT = {"include_usage": True, "continuous_usage_stats": True}
# What each kind answers on GET (the proxy reads /v1/models at start; kinds come from these answers).
DOCUMENTS: dict[str, dict[str, Any]] = {
    "vllm": {"/v1/models": {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}},
    "sglang": {"/v1/models": {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "sglang"}]}},
    "llamacpp": {"/v1/models": {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "llamacpp"}]}},
    "tgi": {
        "/v1/models": {"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "m"}]},
        "/info": {"model_id": "m", "router": "text-generation-router", "max_total_tokens": 4096},
    },
}
# (fixture, what the client asks for). The proxy always asks the upstream for include_usage, so a fixture
# recorded with it stands for what the upstream sends whatever the client asked; continuous usage is asked
# only for clients that ask for it. tgi_old_chat: a TGI that ignores stream_options (and sends no [DONE]).
CASES = [
    *[
        (name, options)
        for name in (
            "vllm_chat_usage",
            "vllm_completions_usage",
            "sglang_chat_usage",
            "sglang_completions_usage",
            "llamacpp_chat_usage",
            "llamacpp_completions",
            "llamacpp_old_chat",
            "llamacpp_old_completions",
            "tgi_chat_usage",
            "tgi_completions",
            "tgi_old_chat",
        )
        for options in ({}, INC)
    ],
    ("vllm_chat_continuous", CONT),
    ("vllm_completions_continuous", CONT),
    ("sglang_chat_continuous", CONT),
]


class _PacedSocket:
    """The replaying upstream's socket, paced by the proxy: a write carrying tokens waits (after the recorded
    gap) until the proxy counted the previous one's tokens, so the proxy reads every token-carrying write
    separately, however loaded the machine (a stall would otherwise let two writes arrive in one read)."""

    def __init__(self, conn: socket.socket, fixture: Fixture, counted: Callable[[], float]) -> None:
        self._conn = conn
        self._fixture = fixture
        self._counted = counted
        self._before_last: float | None = None  # the count before the previous token-carrying write

    def sendall(self, data: bytes) -> None:
        body = data.partition(b"\r\n")[2]  # after the HTTP chunk's size line
        if any(_content(self._fixture, line[5:].strip()) for line in body.splitlines() if line.startswith(b"data:")):
            if self._before_last is not None:
                deadline = time.monotonic() + 30
                while self._counted() <= self._before_last and time.monotonic() < deadline:
                    time.sleep(0.001)
            self._before_last = self._counted()
        self._conn.sendall(data)


@dataclass
class _PacedReplay(ReplayUpstream):
    counted: Callable[[], float] = lambda: 0.0
    """The proxy's output tokens so far (all its series)."""

    def _stream(self, conn: socket.socket, fixture: Fixture | None) -> None:
        assert fixture is not None
        super()._stream(_PacedSocket(conn, fixture, self.counted), fixture)  # type: ignore[arg-type]


@dataclass
class Rig:
    upstream: ReplayUpstream
    url: str
    registry: CollectorRegistry


@pytest.fixture(scope="module")
def rigs() -> Iterator[dict[str, Rig]]:
    """One upstream and proxy per kind, shared by the cases (metrics are read as differences)."""
    out: dict[str, Rig] = {}
    stack: list[Any] = []
    try:
        for kind, documents in DOCUMENTS.items():
            registry = CollectorRegistry()
            upstream = _PacedReplay(documents=documents, counted=lambda r=registry: _tokens(r))  # type: ignore[misc]
            stack.append(upstream)
            app = create_app(
                OpenAIProxyEngine(upstream.url, registry=registry),
                ServeSettings(),
                registry=registry,
                tracing=Tracing.disabled(),
            )
            server = serve_app(app)
            out[kind] = Rig(upstream, server.__enter__(), registry)
            stack.append(server)
        yield out
    finally:
        for item in reversed(stack):
            if isinstance(item, ReplayUpstream):
                item.close()
            else:
                item.__exit__(None, None, None)


def _content(fixture: Fixture, payload: bytes) -> bool:
    try:
        chunk = json.loads(payload)
    except ValueError:
        return False
    choices = chunk.get("choices") or []
    if not choices:
        return False
    if fixture.endpoint == "chat":
        delta = choices[0].get("delta") or {}
        return bool(delta.get("content") or delta.get("reasoning_content"))
    return bool(choices[0].get("text"))


def _expected_body(fixture: Fixture, options: dict[str, bool]) -> bytes:
    """The upstream's data frames as the proxy forwards them (docs/serving.md, *Streaming*): comments and the
    upstream's [DONE] not forwarded (the proxy writes its own); the usage-only chunk only to a client that
    asked for usage, a client that did not getting its ``system_fingerprint`` last on the finishing chunk (where
    vLLM writes it when no usage is asked for); usage on a choice chunk stripped only for a client that asked
    for none."""
    out: list[bytes] = []
    finishing: int | None = None  # out's index of the finishing chunk
    for payload in fixture.data_payloads():
        if payload == b"[DONE]":
            continue
        chunk = json.loads(payload)
        if not chunk.get("choices"):
            if options.get("include_usage"):
                out.append(payload)
            elif "system_fingerprint" in chunk and finishing is not None:
                fingerprint = json.dumps(chunk["system_fingerprint"], ensure_ascii=False).encode()
                out[finishing] = out[finishing][:-1] + b',"system_fingerprint":' + fingerprint + b"}"
            continue
        if chunk["choices"][0].get("finish_reason") and "system_fingerprint" not in chunk:
            finishing = len(out)
        if "usage" in chunk and chunk["usage"] is not None and not options:
            chunk.pop("usage")
            payload = json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode()
        out.append(payload)
    return b"".join(b"data: " + p + b"\n\n" for p in out) + b"data: [DONE]\n\n"


def _value(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _tokens(registry: CollectorRegistry) -> float:
    return sum(s.value for m in registry.collect() for s in m.samples if s.name == "loadlens_output_tokens_total")


@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{'+'.join(o) or 'none'}" for n, o in CASES])
def test_proxy_forwards_and_measures_each_recorded_stream(
    rigs: dict[str, Rig], name: str, options: dict[str, bool]
) -> None:
    fixture = load(name)
    expect = fixture.expect
    rig = rigs[fixture.source["kind"]]
    rig.upstream.fixture = fixture
    operation = "chat" if fixture.endpoint == "chat" else "text_completion"
    gen = {
        "gen_ai_operation_name": operation,
        "gen_ai_provider_name": "openai",
        "gen_ai_request_model": "m",
        "priority_class": "interactive",
    }
    ia = {"model_name": "m", "priority_class": "interactive"}
    source = "usage" if expect["itl_source"] == "usage" else "final_usage" if expect["usage_reported"] else "chunks"
    names = {
        "ttft_count": ("gen_ai_server_time_to_first_token_seconds_count", gen),
        "ttft_sum": ("gen_ai_server_time_to_first_token_seconds_sum", gen),
        "itl_count": ("loadlens_inter_token_latency_seconds_count", ia),
        "streamed": ("loadlens_output_tokens_total", ia),
        "output_sum": ("gen_ai_server_token_usage_sum", {**gen, "gen_ai_token_type": "output"}),
        "source": ("loadlens_proxy_token_counts_total", {"source": source}),
    }
    before = {k: _value(rig.registry, n, labels) for k, (n, labels) in names.items()}

    body: dict[str, Any] = {"model": "m", "max_tokens": 5, "stream": True}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if fixture.endpoint == "chat" else {"prompt": "hi"})
    if options:
        body["stream_options"] = options
    response = httpx.post(rig.url + fixture.path, json=body, timeout=30)

    assert response.status_code == 200
    assert response.content == _expected_body(fixture, options)
    sent = rig.upstream.seen[-1].body
    assert sent is not None and sent["stream_options"] == {**options, "include_usage": True}
    after = {k: _value(rig.registry, n, labels) for k, (n, labels) in names.items()}
    delta = {k: after[k] - before[k] for k in names}
    assert delta["ttft_count"] == 1
    assert delta["ttft_sum"] >= expect["ttft_ms"] / 1000 - 0.002  # no frame arrives before it is sent
    # Output tokens as they stream: the usage counts when every chunk carries them, else one per content chunk.
    streamed = expect["output_tokens"] if expect["itl_source"] == "usage" else expect["chunks"]
    assert delta["streamed"] == streamed
    assert delta["output_sum"] == expect["output_tokens"]  # the request's total: the upstream's usage
    assert delta["source"] == 1
    # One ITL sample per further read carrying tokens; the paced upstream makes each token-carrying write one
    # such read (unpaced, a loaded host can let two writes arrive in one read: fewer samples, never more).
    token_writes = sum(
        1 for _, data in fixture.writes() if any(_content(fixture, line[5:].strip()) for line in data.splitlines())
    )
    assert delta["itl_count"] == token_writes - 1
    kind = fixture.source["kind"]
    assert rig.registry.get_sample_value("loadlens_proxy_upstream_info", {"upstream_kind": kind}) == 1
