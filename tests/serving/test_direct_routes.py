"""Generation requests served below the FastAPI stack (exporters/serving/direct_routes.py): the same response
and the same metrics as through FastAPI, request for request, for the proxy and for a local engine; requests
the direct routes leave to FastAPI still served by it; an exception escaping the route answered as
Starlette's error middleware answers it."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.types import Message, Receive, Scope, Send

from exporters.serving import streaming
from exporters.serving.app import ServeSettings, create_app
from exporters.serving.direct_routes import DirectRoutes
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.tracing import Tracing
from tests.serving.fakes import ScriptedEngine
from tests.support.server import serve_app

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
JSON = {"content-type": "application/json"}


def _chat(**extra: object) -> dict[str, object]:
    return {"model": "scripted", "messages": [{"role": "user", "content": "hello there"}], **extra}


def _prompt(**extra: object) -> dict[str, object]:
    return {"model": "scripted", "prompt": "hello there", **extra}


# (path, body bytes, headers): every kind of outcome a generation route has.
CASES: dict[str, tuple[str, bytes, dict[str, str]]] = {
    "chat streamed": (CHAT, httpx.Request("POST", "/", json=_chat(max_tokens=3, stream=True)).read(), JSON),
    "completions streamed with usage": (
        COMPLETIONS,
        httpx.Request(
            "POST", "/", json=_prompt(max_tokens=4, stream=True, stream_options={"include_usage": True})
        ).read(),
        JSON,
    ),
    "chat whole": (CHAT, httpx.Request("POST", "/", json=_chat(max_tokens=2)).read(), JSON),
    "completions whole, no content type": (
        COMPLETIONS,
        httpx.Request("POST", "/", json=_prompt(max_tokens=2)).read(),
        {},
    ),
    "invalid JSON": (CHAT, b'{"model": "scripted", ', JSON),
    "not an object": (COMPLETIONS, b"[1, 2]", JSON),
    "missing messages": (CHAT, b'{"model": "scripted"}', JSON),
    "wrong type": (COMPLETIONS, httpx.Request("POST", "/", json=_prompt(max_tokens="many")).read(), JSON),
    "unknown model": (CHAT, httpx.Request("POST", "/", json={**_chat(), "model": "nope"}).read(), JSON),
    "engine refuses": (COMPLETIONS, httpx.Request("POST", "/", json=_prompt(max_tokens=5000)).read(), JSON),
    "empty body": (CHAT, b"", JSON),
}

_VOLATILE = [
    (re.compile(rb"[0-9a-f]{32}"), b"<id>"),  # request ids, trace ids
    (re.compile(rb'"created":\s*\d+'), b'"created":0'),
]


def _normalised(data: bytes) -> bytes:
    for pattern, repl in _VOLATILE:
        data = pattern.sub(repl, data)
    return data


def _response(r: httpx.Response) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers (but the date) and body, ids and timestamps normalised."""
    headers = [(k.lower(), _normalised(v)) for k, v in r.headers.raw if k.lower() != b"date"]
    return r.status_code, headers, _normalised(r.content)


_TIMED = ("loadlens_sla_breaches", "loadlens_goodput_requests", "loadlens_proxy_upstream_retries", "process_")
"""Series that follow the clock, not the request: the SLA verdict (how long it took), a retry on an upstream
connection gone stale while idle, the process's own."""


_READS = ("loadlens_inter_token_latency_seconds_count",)
"""Through the proxy, series that follow how the upstream's bytes were read, not the request: one inter-token
gap per read that carried tokens, and a loaded machine may join two of the upstream's writes in one read
(the token counts do not change: each frame in a read is counted)."""


def _samples(
    registry: CollectorRegistry, skip: tuple[str, ...] = ()
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample but the clock's: times (buckets and sums of ``*_seconds``), creation stamps, ``_TIMED``,
    and ``skip``."""
    out = {}
    for metric in registry.collect():
        for s in metric.samples:
            timed = "seconds" in s.name and not s.name.endswith("_count")
            if timed or s.name.endswith("_created") or s.name.startswith(_TIMED) or s.name in skip:
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _delta(before: dict[Any, float], after: dict[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def _http_observed(registry: CollectorRegistry) -> float:
    """Requests the HTTP layer has finished recording: ``HttpMetrics.observe`` counts the request first and
    observes its duration last, so a request's duration count appears once all its HTTP series have it."""
    return sum(
        s.value for m in registry.collect() for s in m.samples if s.name == "http_request_duration_seconds_count"
    )


def _in_flight(registry: CollectorRegistry) -> float:
    return sum(s.value for m in registry.collect() for s in m.samples if s.name == "loadlens_requests_in_flight")


class _Spy:
    """Counts the requests the direct routes served (``of``: only these routes', e.g. not the upstream's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, of: DirectRoutes | None = None) -> None:
        self.served = 0
        serve = DirectRoutes.serve

        async def counted(routes: DirectRoutes, route: Any, scope: Scope, receive: Receive, send: Send) -> None:
            self.served += of is None or routes is of
            await serve(routes, route, scope, receive, send)

        monkeypatch.setattr(DirectRoutes, "serve", counted)


class _Rig:
    """One app on a real server, its direct routes switchable off (``app.direct = None``: FastAPI serves all)."""

    def __init__(self, url: str, app: Any, registry: CollectorRegistry, skip: tuple[str, ...] = ()) -> None:
        self.url = url
        self.app = app
        self.registry = registry
        self.direct = app.direct
        self.skip = skip

    def call(self, case: str, *, direct: bool) -> tuple[tuple[int, list[tuple[bytes, bytes]], bytes], dict[Any, float]]:
        """The response to one case and what it changed in the metrics (once the request is recorded)."""
        path, body, headers = CASES[case]
        self.app.direct = self.direct if direct else None
        before, counted = _samples(self.registry, self.skip), _http_observed(self.registry)
        r = httpx.post(self.url + path, content=body, headers=headers, timeout=30)
        deadline = time.monotonic() + 30
        # Recorded after the last byte went out: the HTTP layer's series and the request's own end (in flight
        # back to 0) come from two places, which a loaded machine may run in either order. The HTTP layer's
        # last observation, not its first: a read between the two found http_requests_total counted and the
        # size and duration series not yet.
        while _http_observed(self.registry) < counted + 1 or _in_flight(self.registry) != 0:
            assert time.monotonic() < deadline, "the request was never recorded"
            time.sleep(0.005)
        return _response(r), _delta(before, _samples(self.registry, self.skip))


@pytest.fixture(params=["scripted", "proxy"])
def rig(request: pytest.FixtureRequest) -> Iterator[_Rig]:
    registry = CollectorRegistry()
    if request.param == "scripted":
        app = create_app(ScriptedEngine(), ServeSettings(), registry=registry, tracing=Tracing.disabled())
        with serve_app(app) as url:
            yield _Rig(url, app, registry)
        return
    upstream = create_app(ScriptedEngine(), ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    with serve_app(upstream) as up_url:
        app = create_app(OpenAIProxyEngine(up_url), ServeSettings(), registry=registry, tracing=Tracing.disabled())
        with serve_app(app) as url:
            yield _Rig(url, app, registry, skip=_READS)


@pytest.mark.parametrize("case", list(CASES))
def test_the_direct_route_answers_and_counts_as_the_fastapi_route(
    rig: _Rig, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(monkeypatch, rig.direct)
    rig.call(case, direct=False)  # warm: the proxy's upstream connection, the model's series
    assert spy.served == 0
    through_fastapi = rig.call(case, direct=False)
    assert spy.served == 0
    direct = rig.call(case, direct=True)
    assert spy.served == 1
    assert direct == through_fastapi
    status = direct[0][0]
    assert direct[1][(("http_requests_total", (("handler", CASES[case][0]), ("method", "POST"),
                                               ("status", f"{str(status)[0]}xx"))))] == 1  # fmt: skip
    if status >= 400:
        error = json.loads(direct[0][2])["error"]  # OpenAI-style
        assert (error["code"], type(error["message"]), set(error)) == (
            status,
            str,
            {"message", "type", "param", "code"},
        )


def test_requests_the_direct_routes_leave_to_fastapi_are_served_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    registry = CollectorRegistry()
    app = create_app(ScriptedEngine(), ServeSettings(), registry=registry, tracing=Tracing.disabled())
    with serve_app(app) as url:
        wrong_method = httpx.get(url + CHAT)
        slash = httpx.post(url + COMPLETIONS + "/", json=_prompt(max_tokens=1), follow_redirects=False)
        models = httpx.get(url + "/v1/models")
        served = httpx.post(url + COMPLETIONS, json=_prompt(max_tokens=1))
    assert (wrong_method.status_code, wrong_method.headers["allow"]) == (405, "POST")
    assert wrong_method.json()["error"]["message"] == "Method Not Allowed"
    assert slash.status_code == 307  # FastAPI's redirect to the route without the slash
    assert (models.status_code, served.status_code) == (200, 200)
    assert spy.served == 1


def test_a_middleware_added_later_sees_generation_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    seen: list[str] = []

    class Recorder:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            seen.append(scope["path"])
            await self.app(scope, receive, send)

    app = create_app(ScriptedEngine(), ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    app.add_middleware(Recorder)
    with serve_app(app) as url:
        r = httpx.post(url + CHAT, json=_chat(max_tokens=2, stream=True))
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    assert (seen, spy.served) == ([CHAT], 0)


def _scope(**extra: object) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": CHAT, "root_path": "", "headers": [], **extra}


def test_the_direct_routes_take_only_what_they_were_checked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(ScriptedEngine(), ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    direct = app.direct  # type: ignore[attr-defined]
    assert isinstance(direct, DirectRoutes)
    assert direct.route_for(_scope()) is not None
    assert direct.route_for(_scope(path=COMPLETIONS)) is not None
    assert direct.route_for(_scope(path="/v1/responses")) is None
    assert direct.route_for(_scope(method="GET")) is None
    assert direct.route_for(_scope(root_path="/api")) is None
    app.debug = True
    assert direct.route_for(_scope()) is None
    app.debug = False
    telemetry = app._native_telemetry  # FastAPI's own: on with a global OpenTelemetry provider
    monkeypatch.setattr(telemetry, "enabled", lambda: True)
    assert direct.route_for(_scope()) is None


def test_the_direct_routes_refuse_an_app_with_middleware_they_do_not_reproduce() -> None:
    app = create_app(ScriptedEngine(), ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    app.add_middleware(type("Other", (), {"__init__": lambda self, app: None}))
    with pytest.raises(ValueError, match="HttpMetricsMiddleware alone"):
        DirectRoutes(app, object(), {})  # type: ignore[arg-type]


async def _asgi(app: Any, body: bytes) -> tuple[list[Message], BaseException | None]:
    """One generation request straight through the ASGI app: what it sent, what it raised."""
    sent: list[Message] = []
    incoming = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if incoming:
            return incoming.pop()
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "http_version": "1.1", "method": "POST", "path": CHAT, "raw_path": CHAT.encode(),
             "root_path": "", "scheme": "http", "query_string": b"", "server": ("127.0.0.1", 8000),
             "client": ("127.0.0.1", 5000), "headers": [(b"content-type", b"application/json")]}  # fmt: skip
    try:
        await app(scope, receive, send)
    except Exception as exc:
        return sent, exc
    return sent, None


@pytest.mark.parametrize("started", [False, True])
def test_an_exception_escaping_the_route_is_answered_and_raised_as_through_fastapi(
    monkeypatch: pytest.MonkeyPatch, started: bool
) -> None:
    """A bug the response does not catch (here its ``__call__`` raising) reaches the app: counted (5xx if no
    response started), answered with a 500 JSON if nothing went out yet, and raised to the server, both ways."""

    async def broken(self: Any, scope: Scope, receive: Receive, send: Send) -> None:
        if started:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("a bug")

    monkeypatch.setattr(streaming.GenerationResponse, "__call__", broken)
    spy = _Spy(monkeypatch)
    body = httpx.Request("POST", "/", json=_chat(max_tokens=1)).read()
    results = []
    for direct in (True, False):
        registry = CollectorRegistry()
        app = create_app(ScriptedEngine(), ServeSettings(), registry=registry, tracing=Tracing.disabled())
        if not direct:
            app.direct = None  # type: ignore[attr-defined]
        sent, raised = asyncio.run(_asgi(app, body))
        results.append(
            (
                [{k: _normalised(v) if isinstance(v, bytes) else v for k, v in m.items()} for m in sent],
                repr(raised),
                registry.get_sample_value(
                    "http_requests_total", {"method": "POST", "status": "2xx" if started else "5xx", "handler": CHAT}
                ),
            )
        )
    assert spy.served == 1
    assert results[0] == results[1]
    sent_messages, raised_repr, counted = results[0]
    assert (raised_repr, counted) == ("RuntimeError('a bug')", 1.0)  # under the status that went out
    statuses = [m["status"] for m in sent_messages if m["type"] == "http.response.start"]
    assert statuses == ([200] if started else [500])
