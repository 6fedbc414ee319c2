"""The proxy's CPU per request, in process: deterministic where ``serving.py`` is not.

Run: ``python -m benchmarks.proxy_request [--quick] [--profile N]``. No sockets and no servers: uvicorn's own
HTTP protocol (``HttpToolsProtocol``, as ``loadlens serve`` runs it) is fed the benchmark client's request
bytes (``benchmarks.stream_client``: a streamed completions request, ``ignore_eos``) on a stand-in transport,
and serves it with the real app (``create_app``) and the real proxy engine, whose pool hands out real
upstream ``Connection`` objects on a stand-in transport: the request the proxy writes there is answered with
recorded upstream reads (the sim's, as it streams them: the head, one read per content chunk, the usage chunk
with ``[DONE]`` and the body's end). Each upstream read is fed when the client has received the one before,
so the proxy writes each chunk from the socket callback (``DirectBody``), as it does in the live server with
a real upstream that is slower than the proxy. One keep-alive client connection and one pooled upstream
connection carry every request, as a benchmark client's stream does.

Rows (CPU µs per request, ``time.thread_time``, medians of 5 repeats of N requests each):

1. the whole request through the proxy, at 1 and 4 tokens a request;
2. uvicorn alone: the same request bytes, answered by a bare ASGI app with the same response head and the
   same chunks (what any server on uvicorn pays, the relay excepted);
3. their difference: the proxy's own per-request work (the app, the route, validation, the upstream
   exchange, the metrics, the response), at 1 token a request; and the per-chunk cost of a 128-token
   request spread over its chunks is ``(whole at 4 - whole at 1) / 3`` per further chunk.

``--profile N``: cProfile over N whole requests at 1 token, the top functions by own time, instead of rows.
The garbage collector is set as ``loadlens serve`` sets it (start-up objects frozen, generation 0 at 50,000)
while measuring, and restored after.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import pstats
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.types import Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from benchmarks.stream_client import _request_bytes
from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engine import ModelCard
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.engines.openai.upstream_connection import Connection
from exporters.serving.engines.openai.upstream_pool import ConnectionPool
from exporters.serving.request_log import configure_logging
from exporters.serving.responses import DONE, ChunkWriter

MODEL = "deepseek-r1-distill-llama-8b"
PROMPT_TOKENS = 161
UPSTREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 06:03:13 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
    b"x-request-id: b9f35ad4ff0641f48dcbfe3e7e744665\r\ntransfer-encoding: chunked\r\n\r\n"
)
END = b"0\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def upstream_reads(tokens: int) -> list[bytes]:
    """The sim's answer to a streamed completions request of ``tokens`` tokens with ``include_usage``, read by
    read: the head, one content chunk each, then the usage chunk, ``[DONE]`` and the body's end."""
    writer = ChunkWriter("completions", "cmpl-b9f35ad4ff0641f48dcbfe3e7e744665", MODEL, 1_796_450_593, False)
    reads = [UPSTREAM_HEAD]
    for i in range(tokens):
        finish = "length" if i == tokens - 1 else None
        reads.append(_chunk(writer.content(f" w{i % 97}", 0, 0, finish, None)))
    reads.append(_chunk(writer.usage(PROMPT_TOKENS, tokens) + DONE) + END)
    return reads


class _Transport:
    """A transport whose writes are recorded (``wrote``, then ``on_write``); no socket behind it."""

    def __init__(self, on_write: Callable[[bytes], None] | None = None) -> None:
        self.on_write = on_write
        self.written = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self.on_write is not None:
            self.on_write(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


class _Upstream:
    """The upstream's side of the proxy's connection: a request written is answered read by read. The head
    comes at once; the first body read once the client has the response head (the proxy then waits for the
    upstream's next read), each later one right after the proxy took the one before (from the loop, in turn):
    every body read finds the proxy waiting for it, as reads a few milliseconds apart do."""

    def __init__(self, loop: asyncio.AbstractEventLoop, reads: list[bytes]) -> None:
        self.loop = loop
        self.reads = reads
        self.conn: Connection | None = None
        self._next = len(reads)

    def request(self, raw: bytes) -> None:
        self._next = 0
        self.loop.call_soon(self._feed)

    def client_received(self) -> None:
        """The client got a write: the response head, when the upstream has sent only its own head."""
        if self._next == 1:
            self.loop.call_soon(self._feed)

    def _feed(self) -> None:
        i = self._next
        self._next += 1
        assert self.conn is not None
        self.conn.data_received(self.reads[i])
        if i > 0 and self._next < len(self.reads):
            self.loop.call_soon(self._feed)


class _Pool(ConnectionPool):
    """The proxy's pool, its connections on the stand-in upstream."""

    upstream: _Upstream

    async def _connect(self) -> Connection:
        conn = Connection(self)
        conn.connection_made(_Transport(lambda raw: self.upstream.request(raw)))  # type: ignore[arg-type]
        self.upstream.conn = conn
        self._all.add(conn)  # as ConnectionPool._connect does
        return conn


class Rig:
    """One client connection into uvicorn serving ``app``; :meth:`request` sends one request and returns when
    its handling task has ended."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], upstream: _Upstream | None) -> None:
        self.state = ServerState()
        config = Config(app, loop="none", http="httptools", access_log=False, log_level="warning", lifespan="off")
        self.protocol = HttpToolsProtocol(config, self.state, {})
        self.upstream = upstream
        self.client = _Transport(self._client_got)
        self.protocol.connection_made(self.client)  # type: ignore[arg-type]
        self.responses = 0

    def _client_got(self, data: bytes) -> None:
        if data.endswith(END):
            self.responses += 1
        if self.upstream is not None:
            self.upstream.client_received()

    async def request(self, raw: bytes) -> None:
        done = self.responses
        self.protocol.data_received(raw)
        for task in list(self.state.tasks):
            await task
        if self.responses != done + 1:
            raise RuntimeError("the request ended without a complete chunked response")


async def proxy_rig(tokens: int) -> Rig:
    """The app around the proxy engine, its upstream answering with ``tokens`` tokens a request."""
    loop = asyncio.get_running_loop()
    registry = CollectorRegistry()
    engine = OpenAIProxyEngine("http://127.0.0.1:9", registry=registry, upstream_kind="vllm")
    upstream = _Upstream(loop, upstream_reads(tokens))
    pool = _Pool("127.0.0.1", 9, limit=1024, connect_timeout_s=5.0, read_timeout_s=600.0, keepalive_s=4.0)
    pool.upstream = upstream
    engine._pool = pool
    engine._cards = [ModelCard(MODEL, owned_by="vllm", max_model_len=131072)]
    app: Any = create_app(engine, ServeSettings(), registry=registry)
    await app.state.serving.refresh_models()
    return Rig(app, upstream)


def bare_app(tokens: int) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI app that answers any request with the proxy's response head and the same chunks."""
    reads = upstream_reads(tokens)
    bodies = [r.split(b"\r\n", 1)[1][:-2] for r in reads[1:-1]]
    tail = reads[-1].split(b"\r\n", 1)[1][: -len(END) - 2]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", b"0123456789abcdef0123456789abcdef"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for body in bodies:
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    return app


async def per_request(rig: Rig, raw: bytes, n: int, repeat: int = 5) -> float:
    """Median CPU µs per request over ``repeat`` runs of ``n`` requests."""
    for _ in range(20):  # warm: the pooled connection, the series bound at the first success
        await rig.request(raw)
    samples = []
    for _ in range(repeat):
        t0 = time.thread_time()
        for _ in range(n):
            await rig.request(raw)
        samples.append((time.thread_time() - t0) / n)
    return statistics.median(samples) * 1e6


async def measure(n: int) -> list[tuple[str, float]]:
    raw = {t: _request_bytes("127.0.0.1", 8000, MODEL, t) for t in (1, 4)}
    rows: list[tuple[str, float]] = []
    whole = {t: await per_request(await proxy_rig(t), raw[t], n) for t in (1, 4)}
    bare = {t: await per_request(Rig(bare_app(t), None), raw[t], n) for t in (1, 4)}
    for t in (1, 4):
        rows.append((f"whole request through the proxy, {t} token{'s' if t > 1 else ''}", whole[t]))
    for t in (1, 4):
        rows.append((f"  uvicorn alone (a bare ASGI app, the same chunks), {t} token{'s' if t > 1 else ''}", bare[t]))
    rows.append(("the proxy's own per request (whole - uvicorn alone, 1 token)", whole[1] - bare[1]))
    rows.append(("  each further chunk ((whole at 4 - whole at 1) / 3)", (whole[4] - whole[1]) / 3))
    return rows


async def profile(n: int, top: int = 40) -> str:
    rig = await proxy_rig(1)
    raw = _request_bytes("127.0.0.1", 8000, MODEL, 1)
    for _ in range(20):
        await rig.request(raw)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        await rig.request(raw)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def _run(coro: Awaitable[Any]) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with the serve extra
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (smoke test of the benchmark itself)")
    parser.add_argument("--requests", type=int, default=0, help="requests per repeat (default 2,000; --quick 100)")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile N requests instead")
    args = parser.parse_args(argv)
    n = args.requests or (100 if args.quick else 2_000)
    configure_logging("warning")  # as the benchmark's servers run (--log-level warning): no request log line
    threshold = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        if args.profile:
            print(_run(profile(args.profile)))
            return 0
        rows = _run(measure(n))
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
    print(f"\n## The proxy's CPU per request, in process ({n} requests; CPU µs per request, medians of 5)")
    for name, us in rows:
        print(f"{name:72} {us:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
