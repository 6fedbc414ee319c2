"""The proxy's streaming HTTP/1.1 client (exporters/serving/engines/openai/upstream_*.py): chunked decoding from
any split of the bytes, one consumer call per read, keep-alive reuse and expiry, the pool bound, and failures
typed by when they happened, which decides whether the proxy may send a request again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.engine import GenerationRequest, OutputEvent, SamplingParams
from exporters.serving.engines.openai import upstream_http
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.engines.openai.errors import failure_reason, retry_reason
from exporters.serving.engines.openai.frames import FrameReader
from exporters.serving.engines.openai.stream import ProxyStream
from exporters.serving.engines.openai.upstream_connection import Connection
from exporters.serving.engines.openai.upstream_http import (
    BrokenBody,
    ClosedBeforeAnswer,
    ConnectFailed,
    InvalidResponse,
    NoAnswerInTime,
    Response,
)
from exporters.serving.engines.openai.upstream_pool import ConnectionPool
from loadlens.util.net import free_port

PAYLOADS = [b'data: {"choices":[{"text":"a"}]}\n\n', b'data: {"choices":[{"text":"bc"}]}\n\n', b"data: [DONE]\n\n"]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nRetry-After: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
REQUEST = upstream_http.request_bytes("POST", "/v1/completions", "u:1", {"content-type": "application/json"}, b"{}")


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


RESPONSE = HEAD + b"".join(_chunk(p) for p in PAYLOADS) + b"0\r\n\r\n"


class _Transport:
    """Stands in for a socket transport: records writes and closes."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class _Body:
    """A consumer: what ``on_data`` got, call by call, and the ends ``on_end`` got."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.ends: list[BaseException | None] = []

    def consume(self, response: Response) -> None:
        response.consume(self.reads.append, self.ends.append)


def test_request_bytes() -> None:
    assert REQUEST == (
        b"POST /v1/completions HTTP/1.1\r\nHost: u:1\r\ncontent-type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    )
    with pytest.raises(ValueError, match="'traceparent': line breaks"):
        upstream_http.request_bytes("POST", "/", "u:1", {"traceparent": "x\r\nEvil: 1"}, b"")


def test_chunked_body_decoded_from_every_split_of_the_bytes() -> None:
    """Every split of the response in two reads, and one byte per read: the same head, the same body, one
    end, and the connection back in the pool."""

    async def run() -> None:
        pool = ConnectionPool("127.0.0.1", 1, limit=0, connect_timeout_s=1, read_timeout_s=60, keepalive_s=60)
        splits = [[RESPONSE[:i], RESPONSE[i:]] for i in range(1, len(RESPONSE))]
        splits.append([RESPONSE[i : i + 1] for i in range(len(RESPONSE))])
        for reads in splits:
            conn = Connection(pool)
            transport = _Transport()
            conn.connection_made(transport)  # type: ignore[arg-type]
            pool.open += 1
            exchange = asyncio.ensure_future(conn.exchange(REQUEST, reused=False))
            await asyncio.sleep(0)
            for data in reads:
                conn.data_received(data)
            response = await exchange
            body = _Body()
            body.consume(response)
            assert transport.written == [REQUEST]
            assert (response.status, response.headers["retry-after"], response.reused) == (200, "3", False)
            assert b"".join(body.reads) == b"".join(PAYLOADS)
            assert body.ends == [None]
            response.release()
            assert (pool.idle, transport.closed) == (1, False)
            conn.close()
            pool.lost(conn)  # what connection_lost does
        assert (pool.open, pool.idle) == (0, 0)

    asyncio.run(run())


def test_one_consumer_call_per_read_with_all_of_its_chunks() -> None:
    async def run() -> None:
        pool = ConnectionPool("127.0.0.1", 1, limit=0, connect_timeout_s=1, read_timeout_s=60, keepalive_s=60)
        conn = Connection(pool)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        exchange = asyncio.ensure_future(conn.exchange(REQUEST, reused=True))
        await asyncio.sleep(0)
        conn.data_received(HEAD)
        response = await exchange
        body = _Body()
        body.consume(response)
        conn.data_received(_chunk(PAYLOADS[0]) + _chunk(PAYLOADS[1]))
        conn.data_received(_chunk(PAYLOADS[2])[:9])  # a chunk split mid-payload: what arrived of it
        conn.data_received(_chunk(PAYLOADS[2])[9:])
        assert body.reads == [PAYLOADS[0] + PAYLOADS[1], PAYLOADS[2][:6], PAYLOADS[2][6:]]
        assert body.ends == []
        conn.data_received(b"0\r\n\r\n")
        assert body.ends == [None]
        assert response.reused

    asyncio.run(run())


Action = bytes | tuple[str, bytes] | str | None


class _Upstream:
    """An asyncio HTTP/1.1 server. ``answer(connection_no, request_no)`` says what to do with each request
    (numbered from 1 per connection): bytes to write; ``("close", bytes)`` to write them and close; ``None``
    to close without answering; ``"hang"`` to never answer."""

    def __init__(self, answer: Callable[[int, int], Action]) -> None:
        self.answer = answer
        self.connections = 0
        self.handled: list[tuple[int, int]] = []  # requests answered
        self.dropped: list[tuple[int, int]] = []  # requests read and closed on unanswered
        self.port = 0

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[_Upstream]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lengths = [
                    int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")
                ]
                await reader.readexactly(lengths[0] if lengths else 0)
                served += 1
                action = self.answer(number, served)
                if action == "hang":
                    await asyncio.sleep(3600)
                if action is None:
                    self.dropped.append((number, served))
                    return
                data = action[1] if isinstance(action, tuple) else action
                assert isinstance(data, bytes)
                writer.write(data)
                await writer.drain()
                self.handled.append((number, served))
                if isinstance(action, tuple):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


def _pool(port: int, **overrides: Any) -> ConnectionPool:
    options: dict[str, Any] = {"limit": 4, "connect_timeout_s": 5, "read_timeout_s": 10, "keepalive_s": 10}
    options.update(overrides)
    return ConnectionPool("127.0.0.1", port, **options)


async def _read(pool: ConnectionPool, **kwargs: Any) -> tuple[Response, bytes]:
    response = await pool.request(REQUEST, **kwargs)
    body = await response.read()
    response.release()
    return response, body


def test_keep_alive_connection_is_reused_then_closed_when_idle_past_keepalive() -> None:
    upstream = _Upstream(lambda conn, req: RESPONSE)

    async def run() -> None:
        async with upstream.running():
            pool = _pool(upstream.port, keepalive_s=10)
            first, body = await _read(pool)
            second, _ = await _read(pool)  # within 10 s of the first's release, however busy the machine
            assert (first.reused, second.reused, body) == (False, True, b"".join(PAYLOADS))
            assert (upstream.connections, pool.open, pool.idle) == (1, 1, 1)
            # Idle past keepalive_s on the loop's clock, which the pool's timer reads: moved on, not waited for.
            loop = asyncio.get_running_loop()
            real_time = loop.time
            loop.time = lambda: real_time() + 11  # type: ignore[method-assign]
            await asyncio.sleep(0.01)  # the idle timer is due before this one: the proxy closed the connection
            assert (pool.open, pool.idle) == (0, 0)
            third, _ = await _read(pool)
            assert (third.reused, upstream.connections, upstream.handled) == (False, 2, [(1, 1), (1, 2), (2, 1)])
            await pool.close()

    asyncio.run(run())


def test_upstream_closing_mid_stream_ends_the_body_with_an_error() -> None:
    upstream = _Upstream(lambda conn, req: ("close", HEAD + _chunk(PAYLOADS[0]) + b"5\r\nab"))

    async def run() -> None:
        async with upstream.running():
            pool = _pool(upstream.port)
            response = await pool.request(REQUEST)
            body = _Body()
            body.consume(response)
            for _ in range(3000):
                if body.ends:
                    break
                await asyncio.sleep(0.01)
            assert b"".join(body.reads) == PAYLOADS[0] + b"ab"
            assert len(body.ends) == 1 and isinstance(body.ends[0], BrokenBody)
            assert str(body.ends[0]) == "upstream closed the connection mid-response"
            assert failure_reason(body.ends[0]) == "connection_closed"
            response.release()
            await asyncio.sleep(0.01)
            assert (pool.open, pool.idle) == (0, 0)

    asyncio.run(run())


def test_a_request_on_a_pooled_connection_closed_unanswered_is_provably_unsent() -> None:
    """Answered on connection 1, then the upstream closes connection 1 on the next request (its keep-alive
    timer won the race): that try is retryable, and a fresh connection serves it. A fresh connection closed
    the same way, or one that sent part of an answer, is not retryable."""

    def answer(conn: int, req: int) -> Action:
        if conn == 1:
            return RESPONSE if req == 1 else None
        if conn == 2:
            return RESPONSE
        if conn == 3:
            return None
        return RESPONSE if req == 1 else ("close", b"HTTP/1.1 200 OK\r\n")  # connection 4: part of a head

    upstream = _Upstream(answer)

    async def run() -> None:
        async with upstream.running():
            pool = _pool(upstream.port)
            await _read(pool)
            with pytest.raises(ClosedBeforeAnswer) as stale:
                await pool.request(REQUEST)
            assert (stale.value.reused, stale.value.partial) == (True, False)
            assert retry_reason(stale.value, stale.value.reused) == "stale_connection"
            retried, _ = await _read(pool, fresh=True)
            assert retried.reused is False
            await pool.close()

            pool = _pool(upstream.port)
            with pytest.raises(ClosedBeforeAnswer) as fresh:
                await pool.request(REQUEST)
            assert (fresh.value.reused, retry_reason(fresh.value, fresh.value.reused)) == (False, None)
            assert failure_reason(fresh.value) == "connection_closed"
            await _read(pool)
            with pytest.raises(ClosedBeforeAnswer) as partial:
                await pool.request(REQUEST)
            assert (partial.value.reused, partial.value.partial) == (True, True)
            assert retry_reason(partial.value, partial.value.reused) is None
            await pool.close()
        assert upstream.handled == [(1, 1), (2, 1), (4, 1), (4, 2)]
        assert upstream.dropped == [(1, 2), (3, 1)]

    asyncio.run(run())


def test_the_proxy_sends_a_stale_try_again_once_and_counts_it() -> None:
    upstream = _Upstream(lambda conn, req: RESPONSE if (conn, req) != (1, 2) else None)
    registry = CollectorRegistry()

    async def run() -> None:
        async with upstream.running():
            engine = OpenAIProxyEngine(f"http://127.0.0.1:{upstream.port}", registry=registry)
            engine._pool = _pool(upstream.port)  # the streaming pool alone (start() also opens aiohttp's)
            for _ in range(2):
                response = await engine._open_stream("/v1/completions", b"{}", {})
                assert await response.read() == b"".join(PAYLOADS)
                response.release()
            await engine._pool.close()

    asyncio.run(run())
    assert (upstream.handled, upstream.dropped) == ([(1, 1), (2, 1)], [(1, 2)])
    for reason, expected in (("stale_connection", 1.0), ("connect", 0.0)):
        assert registry.get_sample_value("loadlens_proxy_upstream_retries_total", {"reason": reason}) == expected
    assert registry.get_sample_value("loadlens_proxy_upstream_failures_total", {"reason": "connection_closed"}) == 0


def test_the_pool_bound_holds_and_waiters_are_served_in_order() -> None:
    upstream = _Upstream(lambda conn, req: RESPONSE)

    async def run() -> None:
        async with upstream.running():
            pool = _pool(upstream.port, limit=1)
            held = await pool.request(REQUEST)
            order: list[str] = []

            async def one(name: str, fresh: bool = False) -> Response:
                response, _ = await _read(pool, fresh=fresh)
                order.append(name)
                return response

            waiting = [asyncio.ensure_future(one("b")), asyncio.ensure_future(one("c", fresh=True))]
            await asyncio.sleep(0.05)
            assert (pool.open, order, upstream.connections) == (1, [], 1)
            await held.read()
            held.release()
            b, c = await asyncio.gather(*waiting)
            assert order == ["b", "c"]
            # b took the connection held; c wanted a new one: it got the slot of the one b gave back.
            assert (b.reused, c.reused, upstream.connections, pool.open) == (True, False, 2, 1)
            await pool.close()

    asyncio.run(run())


def test_no_answer_within_the_read_timeout() -> None:
    upstream = _Upstream(lambda conn, req: "hang")

    async def run() -> None:
        async with upstream.running():
            pool = _pool(upstream.port, read_timeout_s=0.2)
            with pytest.raises(NoAnswerInTime, match="no bytes from the upstream for 0.2 s") as err:
                await pool.request(REQUEST)
            assert (failure_reason(err.value), retry_reason(err.value, err.value.reused)) == ("timeout", None)
            await asyncio.sleep(0.01)
            assert pool.open == 0
            await pool.close()

    asyncio.run(run())


def test_connect_refused_and_invalid_responses() -> None:
    upstream = _Upstream(lambda conn, req: b"SSH-2.0-OpenSSH\r\n\r\n")

    async def run() -> None:
        pool = _pool(free_port())
        with pytest.raises(ConnectFailed, match="cannot connect to 127.0.0.1") as refused:
            await pool.request(REQUEST)
        assert (retry_reason(refused.value, False), failure_reason(refused.value), pool.open) == (
            "connect",
            "connect",
            0,
        )
        async with upstream.running():
            pool = _pool(upstream.port)
            with pytest.raises(InvalidResponse, match="not an HTTP|invalid HTTP response") as bad:
                await pool.request(REQUEST)
            assert failure_reason(bad.value) == "invalid_response"
            await pool.close()

    asyncio.run(run())


class _FakeResponse:
    """What a ProxyStream needs of its upstream response."""

    def __init__(self) -> None:
        self.paused = False
        self.closed = False
        self.released = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        self.released = True


def _content(text: str) -> bytes:
    return b'data: {"choices":[{"index":0,"text":"%s","finish_reason":null}]}\n\n' % text.encode()


def test_the_stream_hands_events_to_the_sink_only_while_its_consumer_waits() -> None:
    """Reads while the consumer is busy, or refused by the sink, queue in order; the sink is offered events
    again once the queue is empty and the consumer waits; the end comes from __anext__."""

    async def run() -> None:
        request = GenerationRequest(
            request_id="r", endpoint="completions", model="m", prompt="p", image_count=0,
            sampling=SamplingParams(max_tokens=8), arrival_time=0.0, body={}, stream_requested=True,
        )  # fmt: skip
        response = _FakeResponse()
        stream = ProxyStream(response, request, "http://u:1")  # type: ignore[arg-type]
        taken: list[bytes | None] = []
        accept = [True]

        def sink(event: OutputEvent) -> bool:
            if accept[0]:
                taken.append(event.wire_frames)
            return accept[0]

        assert stream.deliver_to(sink)
        stream.on_data(_content("a"))  # nobody waiting: queued
        first = await stream.__anext__()
        assert (first.wire_frames, taken) == (_content("a"), [])
        consumer = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the consumer now waits
        stream.on_data(_content("b"))
        assert (taken, consumer.done()) == ([_content("b")], False)
        accept[0] = False
        stream.on_data(_content("c"))  # refused: queued, the consumer woken
        accept[0] = True
        stream.on_data(_content("d"))  # the queue is not empty: behind c, not to the sink
        assert [(await consumer).wire_frames, (await stream.__anext__()).wire_frames] == [_content("c"), _content("d")]
        assert taken == [_content("b")]
        consumer = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        stream.on_data(_content("e") + b"data: [DONE]\n\n")
        with pytest.raises(StopAsyncIteration):
            await consumer
        assert taken == [_content("b"), _content("e")]
        assert (stream._frames.output_tokens, response.released, response.closed) == (5, False, True)  # no finish seen

    asyncio.run(run())


def test_a_plain_sink_gets_what_the_sink_would_and_a_refused_plain_read_queues_its_event() -> None:
    """``deliver_to(sink, plain)``: plain content reads go to ``plain`` as (frames, prompt, output) without
    their event, every other read to ``sink``; what the two receive, and what is queued when they refuse, is
    what ``sink`` alone receives and queues. The marks and the first token's time are stamped either way."""

    plain_calls: list[bytes] = []

    def run(with_plain: bool) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]], int, bool]:
        async def go() -> tuple[list[tuple[object, ...]], list[tuple[object, ...]], int, bool]:
            request = GenerationRequest(
                request_id="r", endpoint="completions", model="m", prompt="p", image_count=0,
                sampling=SamplingParams(max_tokens=8), arrival_time=0.0, body={}, stream_requested=True,
            )  # fmt: skip
            stream = ProxyStream(_FakeResponse(), request, "http://u:1")  # type: ignore[arg-type]
            got: list[tuple[object, ...]] = []
            accept = [True]

            def fields(e: OutputEvent) -> tuple[object, ...]:
                return (e.text, e.new_tokens, e.prompt_tokens, e.output_tokens, e.finish_reason, e.wire_frames)

            def sink(event: OutputEvent) -> bool:
                if accept[0]:
                    got.append(("sink", *fields(event)))
                return accept[0]

            def plain(frames: bytes, prompt: int, output: int) -> bool:
                plain_calls.append(frames)
                if accept[0]:
                    got.append(("sink", "", 1, prompt, output, None, frames))
                return accept[0]

            stream.deliver_to(sink, plain if with_plain else None)
            queued: list[tuple[object, ...]] = []
            consumer = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0)
            for text in ("a", "b", "c"):  # the first is learned, the next two match it
                stream.on_data(_content(text))
            accept[0] = False
            stream.on_data(_content("d"))  # refused: queued, the consumer woken
            queued.append(fields(await consumer))
            accept[0] = True
            consumer = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0)
            stream.on_data(_content("e"))
            stream.on_data(b'data: {"choices":[{"index":0,"text":"f","finish_reason":"length"}]}\n\n')
            stream.on_data(b"data: [DONE]\n\n")
            with pytest.raises(StopAsyncIteration):
                await consumer
            return got, queued, len(stream._marks), stream.timing.first_token is not None

        return asyncio.run(go())

    with_plain, without = run(True), run(False)
    assert with_plain == without
    assert plain_calls == [_content(t) for t in "bcde"]  # the learned chunk again: b, c, d (refused), e
    got, queued, marks, first_token = with_plain
    # f's finishing frame is held for the usage chunk's fingerprint (none comes), then sent with [DONE]
    assert [g[3:5] for g in got] == [(0, 1), (0, 2), (0, 3), (0, 5), (0, 6), (0, 6)]
    assert queued == [("", 1, 0, 4, None, _content("d"))]
    assert (marks, first_token) == (1 + 6, True)  # admission, then each read carrying tokens


def test_a_plain_read_is_not_taken_past_a_held_finishing_frame() -> None:
    """While a finishing frame waits for the usage chunk's fingerprint (n > 1: another choice's content may
    follow it), a read matching the learned chunk goes through ``feed``, which keeps the upstream's order."""
    reader = FrameReader("http://u:1", chat=False, client_streams=True)
    assert reader.feed(_content("a")) is not None  # learned
    assert reader.plain(_content("b"))
    finish = b'data: {"choices":[{"index":1,"text":"z","finish_reason":"length"}]}\n\n'
    held = reader.feed(finish)
    assert held is not None and held.wire_frames == b""  # held: nothing to write yet
    assert not reader.plain(_content("c"))
    event = reader.feed(_content("c"))
    assert event is not None and event.wire_frames == finish + _content("c")  # the upstream's order


def test_a_bug_in_reading_a_chunk_reaches_the_consumer_not_the_socket_callback() -> None:
    async def run() -> None:
        request = GenerationRequest(
            request_id="r", endpoint="completions", model="m", prompt="p", image_count=0,
            sampling=SamplingParams(max_tokens=8), arrival_time=0.0, body={}, stream_requested=True,
        )  # fmt: skip
        response = _FakeResponse()
        stream = ProxyStream(response, request, "http://u:1")  # type: ignore[arg-type]

        def bug(data: bytes) -> None:
            raise RuntimeError("a bug in _feed")

        stream._feed = bug  # type: ignore[method-assign]
        stream.on_data(_content("a"))  # raises nothing into data_received
        with pytest.raises(RuntimeError, match="a bug in _feed"):
            await stream.__anext__()
        assert (response.closed, stream._closed) == (True, True)

    asyncio.run(run())
