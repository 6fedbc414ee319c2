"""A reference load client for the serving benchmarks that is not itself the bottleneck.

Closed-loop streaming users, one keep-alive HTTP/1.1 connection each, on a bare ``asyncio.Protocol`` with
httptools' C parser (chunked decoding included): no per-line async iteration and no ``json.loads`` per chunk.
A chunk is a token when its ``"text"`` (completions) is a non-empty string, read by byte search
(``loadlens.util.sse``). Every chunk that arrives in one socket read is stamped with that read's time, as a
client would see it. The caller measures this process's CPU time around :func:`run_load`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import cast

import httptools

from loadlens.util import sse


@dataclass
class LoadResult:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    chunks: int = 0
    """SSE data frames received, ``[DONE]`` excluded: what a proxy forwarded."""
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    client_cpu_s: float = 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class _Connection(asyncio.Protocol):
    def __init__(self, out: LoadResult) -> None:
        self.out = out
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None
        self.lost = asyncio.get_running_loop().create_future()
        self.now = 0.0
        self.sent_at = 0.0
        self.last: float | None = None
        self.status = 0
        self.buf = b""

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self.now = time.perf_counter()
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"server closed the connection: {exc}"))
        if not self.lost.done():
            self.lost.set_result(None)

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            return
        buf = self.buf + body if self.buf else body
        end = buf.rfind(b"\n\n")
        if end < 0:
            self.buf = buf
            return
        self.buf = buf[end + 2 :]
        now = self.now
        out = self.out
        for frame in buf[:end].split(b"\n\n"):
            if frame[:7] != b"data: {":
                continue
            out.chunks += 1
            if sse.string_start(frame, b'"text"') is not sse.NON_EMPTY:
                continue
            out.tokens += 1
            if self.last is None:
                out.ttft.append(now - self.sent_at)
            else:
                out.itl.append(now - self.last)
            self.last = now

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    async def request(self, raw: bytes) -> int:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.last = None
        self.buf = b""
        self.status = 0
        self.sent_at = time.perf_counter()
        self.transport.write(raw)
        await self.done
        return self.status


def _request_bytes(host: str, port: int, model: str, max_tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "prompt": "benchmark prompt " * 32,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }  # fmt: skip
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _user(host: str, port: int, raw: bytes, stop_at: float, out: LoadResult, warm: bool) -> None:
    loop = asyncio.get_running_loop()
    conn: _Connection | None = None
    while warm or time.perf_counter() < stop_at:
        if conn is None or conn.lost.done():
            _, conn = await loop.create_connection(lambda: _Connection(out), host, port)
        try:
            status = await conn.request(raw)
        except ConnectionError:
            out.errors += 1
            conn = None
            continue
        if status == 200:
            out.requests += 1
        else:
            out.errors += 1
        if warm:
            break
    if conn is not None and conn.transport is not None:
        conn.transport.close()


async def _load(url: str, model: str, streams: int, seconds: float, max_tokens: int) -> LoadResult:
    host, port_text = url.removeprefix("http://").split(":")
    port = int(port_text)
    # Warm the server's code paths and connection pools outside the measured window.
    warm = LoadResult()
    await asyncio.gather(*(_user(host, port, _request_bytes(host, port, model, 4), 0.0, warm, True)
                           for _ in range(streams)))  # fmt: skip
    out = LoadResult()
    raw = _request_bytes(host, port, model, max_tokens)
    cpu0, begun = time.process_time(), time.perf_counter()
    await asyncio.gather(*(_user(host, port, raw, begun + seconds, out, False) for _ in range(streams)))
    out.seconds = time.perf_counter() - begun
    out.client_cpu_s = time.process_time() - cpu0
    return out


def run_load(url: str, model: str, streams: int, seconds: float, max_tokens: int = 128) -> LoadResult:
    """``streams`` closed-loop users for ``seconds`` against ``url`` (``http://host:port``), uvloop if present."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with the serve extra
        return asyncio.run(_load(url, model, streams, seconds, max_tokens))
    return uvloop.run(_load(url, model, streams, seconds, max_tokens))
