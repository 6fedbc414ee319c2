"""Streamed chunks written below the ASGI stack (exporters/serving/direct_body.py): the same bytes uvicorn's
own ``send`` writes, only when it would write at once, the same events for the client as the ASGI path, and
no middleware that would miss them."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from exporters.serving import direct_body, streaming
from exporters.serving.app import ServeSettings, create_app
from exporters.serving.direct_body import SERVER_SEND, DirectBody
from exporters.serving.engine import FinishReason, OutputEvent, RequestTiming
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.engines.sim.stream import SimStream
from exporters.serving.http_metrics import HttpMetricsMiddleware
from exporters.serving.lifecycle import RequestLifecycle
from exporters.serving.metrics import ServingMetrics
from exporters.serving.request_log import RequestLogger
from exporters.serving.responses import ChunkWriter
from exporters.serving.tracing import Tracing
from loadlens.contracts.slo import load_slos
from tests.serving.fakes import ScriptedEngine
from tests.support.server import serve_app


class _Transport:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _cycle() -> tuple[RequestResponseCycle, _Transport, dict[str, Any]]:
    transport = _Transport()
    scope: dict[str, Any] = {"type": "http", "method": "POST", "http_version": "1.1"}
    cycle = RequestResponseCycle(
        scope=scope,  # type: ignore[arg-type]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    scope[SERVER_SEND] = cycle.send
    return cycle, transport, scope


BODIES = [b"data: {}\n\n", b"", b"data: " + b"x" * 5000 + b"\n\n", bytes(range(256))]


def test_direct_writes_are_the_bytes_uvicorns_send_writes() -> None:
    async def run() -> None:
        cycle, transport, scope = _cycle()
        assert DirectBody.of(scope) is None  # before the response head: never
        await cycle.send({"type": "http.response.start", "status": 200, "headers": []})
        direct = DirectBody.of(scope)
        assert direct is not None and direct.writable()
        transport.data = b""
        for body in BODIES:
            await cycle.send({"type": "http.response.body", "body": body, "more_body": True})
        via_send = transport.data
        transport.data = b""
        for body in BODIES:
            direct.write(body)
        assert transport.data == via_send
        assert via_send.startswith(b"a\r\ndata: {}\n\n\r\n1390\r\ndata: xx")

        cycle.flow.pause_writing()  # a full socket buffer: uvicorn's send would wait
        assert not direct.writable()
        cycle.flow.resume_writing()
        cycle.disconnected = True  # gone: uvicorn's send would drop the chunk
        assert not direct.writable()
        cycle.disconnected = False
        await cycle.send({"type": "http.response.body", "body": b"", "more_body": False})
        assert not direct.writable()  # complete

    asyncio.run(run())


def test_only_uvicorns_httptools_send_is_written_below() -> None:
    async def other_send(message: Any) -> None:
        return None

    assert DirectBody.of({"type": "http", "method": "POST", SERVER_SEND: other_send}) is None
    assert DirectBody.of({"type": "http", "method": "POST"}) is None


def test_the_middleware_between_uvicorn_and_the_response_is_what_direct_body_py_checked() -> None:
    """Body chunks written below the ASGI stack skip every middleware's ``send`` wrapper. Each one here looks
    only at the response start and its last message; a new one must be checked the same way (and listed)."""
    app = create_app(ScriptedEngine(), ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    classes: list[object] = [m.cls for m in app.user_middleware]
    assert classes == [HttpMetricsMiddleware]


def _life() -> RequestLifecycle:
    slos = load_slos()
    life = RequestLifecycle.start(
        metrics=ServingMetrics(CollectorRegistry(), slos, "openai", "test"), logger=RequestLogger("logfmt"),
        tracer=None, parent=None, parent_ids=None, request_id="r", path="/v1/completions", endpoint="completions",
        requested_model="m", model_label="m", priority=0, priority_class=slos.classes[0], stream=True,
        arrival=time.monotonic(),
    )  # fmt: skip
    life.admit()
    return life


class _Direct:
    def __init__(self, writable: bool) -> None:
        self.can = writable
        self.written: list[bytes] = []

    def writable(self) -> bool:
        return self.can

    def write(self, body: bytes) -> None:
        self.written.append(body)


def test_the_sink_refuses_what_uvicorn_would_not_write_now_and_records_nothing_then() -> None:
    life = _life()
    out = streaming._Streamed(life, ChunkWriter("completions", "cmpl-r", "m", 0, False), sent_role=True)
    event = OutputEvent("", 1, 3, 1, wire_frames=b"data: {}\n\n")
    paused = _Direct(writable=False)
    assert out.deliver(paused, event) is False  # type: ignore[arg-type]
    assert (paused.written, life.output_tokens, out.saw_wire) == ([], 0, False)
    ready = _Direct(writable=True)
    assert out.deliver(ready, event) is True  # type: ignore[arg-type]
    assert (ready.written, life.output_tokens, out.saw_wire) == ([b"data: {}\n\n"], 1, True)


def _normalised(text: str) -> list[Any]:
    events = [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]
    docs = [json.loads(e) if e.startswith("{") else e for e in events]
    for doc in docs:
        if isinstance(doc, dict):
            doc.pop("created", None)
            doc["id"] = re.sub("[0-9a-f]{32}", "ID", doc["id"])
    return docs


@pytest.mark.parametrize("usage", [False, True])
def test_the_client_gets_the_same_stream_with_and_without_direct_writes(
    monkeypatch: pytest.MonkeyPatch, usage: bool
) -> None:
    written = []
    write = DirectBody.write

    def counting(self: DirectBody, body: bytes) -> None:
        written.append(body)
        write(self, body)

    monkeypatch.setattr(DirectBody, "write", counting)
    # A read reaches the direct path only while the proxy's consumer waits for it. The upstream holds its first
    # token until the proxy's response asks for its DirectBody, from which the consumer goes on to wait with no
    # await in between: no read can be handled before (a stall there would otherwise queue the first token).
    scripted = ScriptedEngine()
    scripted.hold = threading.Event()
    proxy_port = 0
    of = DirectBody.of

    def of_at_the_proxy(cls: type[DirectBody], scope: Any) -> DirectBody | None:
        found = of(scope)
        if scope.get("server", (None, None))[1] == proxy_port:
            assert scripted.hold is not None
            scripted.hold.set()
        return found

    monkeypatch.setattr(DirectBody, "of", classmethod(of_at_the_proxy))
    body: dict[str, Any] = {"model": "scripted", "prompt": "hi", "max_tokens": 4, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    upstream = create_app(scripted, ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    with serve_app(upstream) as up_url:
        app = create_app(OpenAIProxyEngine(up_url), ServeSettings(), registry=CollectorRegistry(),
                         tracing=Tracing.disabled())  # fmt: skip
        with serve_app(app) as url:
            proxy_port = int(url.rsplit(":", 1)[1])
            direct = httpx.post(url + "/v1/completions", json=body, timeout=30).text
            # Every chunk went below the ASGI stack but the last message ([DONE]), which ends the response.
            assert direct.encode() == b"".join(written) + b"data: [DONE]\n\n"
            count = len(written)
            monkeypatch.setattr(direct_body.DirectBody, "of", classmethod(lambda cls, scope: None))
            through_asgi = httpx.post(url + "/v1/completions", json=body, timeout=30).text
    assert len(written) == count
    assert _normalised(direct) == _normalised(through_asgi)
    texts = [d["choices"][0]["text"] for d in _normalised(direct) if isinstance(d, dict) and d["choices"]]
    assert (texts, _normalised(direct)[-1]) == (["t1 ", "t2 ", "t3 ", "t4 "], "[DONE]")


def test_the_sims_stream_hands_events_to_the_sink_only_while_its_consumer_waits() -> None:
    async def run() -> None:
        closed: list[str] = []
        stream = SimStream("r", RequestTiming(), closed.append)
        taken: list[str] = []
        broken = [False]

        def sink(event: OutputEvent) -> bool:
            if broken[0]:
                raise RuntimeError("a bug in the sink")
            taken.append(event.text)
            return True

        assert stream.deliver_to(sink)
        stream.push(OutputEvent("a", 1, 3, 1))
        stream.push(OutputEvent("b", 1, 3, 2))  # nobody waiting: merged into one pending event, as before
        first = await stream.__anext__()
        assert (first.text, first.new_tokens, first.output_tokens, taken) == ("ab", 2, 2, [])
        consumer = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        stream.push(OutputEvent("c", 1, 3, 3))
        assert (taken, consumer.done()) == (["c"], False)
        stream.push(OutputEvent("d", 1, 3, 4, finish_reason=FinishReason.LENGTH))  # the end: the consumer wakes
        with pytest.raises(StopAsyncIteration):
            await consumer
        assert (taken, closed) == (["c", "d"], [])

        stream = SimStream("s", RequestTiming(), closed.append)
        stream.deliver_to(sink)
        consumer = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        broken[0] = True
        stream.push(OutputEvent("e", 1, 3, 1))  # the sink's bug reaches the HTTP layer, not the step loop
        with pytest.raises(RuntimeError, match="a bug in the sink"):
            await consumer

    asyncio.run(run())


def _framed(body: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(body), body)


async def _started() -> tuple[RequestResponseCycle, _Transport, DirectBody]:
    cycle, transport, scope = _cycle()
    await cycle.send({"type": "http.response.start", "status": 200, "headers": []})
    direct = DirectBody.of(scope)
    assert direct is not None
    transport.data = b""
    return cycle, transport, direct


def test_batched_chunks_are_written_by_the_loops_next_pass_in_order_before_what_was_queued_after() -> None:
    async def run() -> None:
        _, first, plain_first = await _started()
        _, second, plain_second = await _started()
        one, two = plain_first.batched(), plain_second.batched()
        seen_by_later_callback: list[tuple[bytes, bytes]] = []
        one.write(b"data: 1\n\n")
        asyncio.get_running_loop().call_soon(lambda: seen_by_later_callback.append((first.data, second.data)))
        two.write(b"data: 2\n\n")
        two.write(b"")  # nothing, as unbatched
        assert (first.data, second.data) == (b"", b"")
        assert (one.writable(), two.writable(), plain_first.writable()) == (False, False, True)
        await asyncio.sleep(0)
        assert (first.data, second.data) == (_framed(b"data: 1\n\n"), _framed(b"data: 2\n\n"))
        assert seen_by_later_callback == [(first.data, second.data)]
        assert (one.writable(), two.writable()) == (True, True)
        one.write(b"data: 3\n\n")  # the next pass's chunk: held again, then written after the first
        await asyncio.sleep(0)
        assert first.data == _framed(b"data: 1\n\n") + _framed(b"data: 3\n\n")

    asyncio.run(run())


def test_a_held_chunk_is_dropped_when_its_client_left_before_the_flush() -> None:
    async def run() -> None:
        cycle, transport, direct = await _started()
        batched = direct.batched()
        batched.write(b"data: 1\n\n")
        cycle.disconnected = True  # uvicorn's send would drop the chunk now
        await asyncio.sleep(0)
        assert transport.data == b""
        assert not batched.writable()

    asyncio.run(run())


def test_a_held_chunk_is_not_written_after_its_responses_end_and_that_is_reported() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        reported: list[str] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
        cycle, transport, direct = await _started()
        batched = direct.batched()
        batched.write(b"data: 1\n\n")
        cycle.response_complete = True  # the terminating chunk went out first: nothing may follow it
        await asyncio.sleep(0)
        assert transport.data == b""
        assert reported == ["a batched response chunk came after its response's end"]

    asyncio.run(run())


class _Refusing(_Transport):
    def write(self, data: bytes) -> None:
        raise RuntimeError("closed")


def test_a_held_chunk_whose_write_raises_is_reported_to_the_loop_and_the_others_are_written() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: reported.append(context))
        cycle, _, refused = await _started()
        cycle.transport = _Refusing()  # type: ignore[assignment]
        _, transport, direct = await _started()
        refused.batched().write(b"data: 1\n\n")
        direct.batched().write(b"data: 2\n\n")
        await asyncio.sleep(0)
        assert transport.data == _framed(b"data: 2\n\n")
        assert [(c["message"], str(c["exception"])) for c in reported] == [
            ("a batched response chunk could not be written", "closed")
        ]

    asyncio.run(run())


def test_one_write_batch_per_event_loop() -> None:
    async def batch() -> direct_body.WriteBatch:
        first = direct_body.WriteBatch.of_running_loop()
        assert direct_body.WriteBatch.of_running_loop() is first
        return first

    assert asyncio.run(batch()) is not asyncio.run(batch())


def test_only_a_stream_of_socket_reads_has_its_chunks_batched() -> None:
    """The proxy's stream makes one read's chunk at a time (batched); the sim's makes a step's in one callback
    (written at once). ``_Streamed.attach`` hands the sinks the writer each one gets."""
    from exporters.serving.engines.openai.stream import ProxyStream

    assert (ProxyStream.batched_writes, SimStream.batched_writes) == (True, False)

    async def run(batched: bool) -> tuple[bytes, bytes]:
        _, transport, direct = await _started()
        stream = SimStream("r", RequestTiming(), lambda _: None)
        stream.batched_writes = batched  # type: ignore[misc]
        plain: list[Any] = []
        stream.deliver_to = lambda sink, p=None: plain.append(p) or True  # type: ignore[method-assign]
        out = streaming._Streamed(_life(), ChunkWriter("completions", "cmpl-r", "m", 0, False), sent_role=True)
        out.attach(stream, direct)
        assert plain[0](b"data: {}\n\n", 3, 1) is True
        at_once = transport.data
        await asyncio.sleep(0)
        return at_once, transport.data

    assert asyncio.run(run(False)) == (_framed(b"data: {}\n\n"), _framed(b"data: {}\n\n"))
    assert asyncio.run(run(True)) == (b"", _framed(b"data: {}\n\n"))
