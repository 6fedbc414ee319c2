"""The proxy's streaming HTTP/1.1 client: keep-alive connections on bare asyncio protocols.

Built for one job, a generation request forwarded to an OpenAI-compatible upstream, and cheap per chunk:
httptools (llhttp, the C parser uvicorn uses) decodes the response (chunked or sized), and every socket read
ends in **one** call of the consumer's ``on_data`` with the body bytes of that read, straight from
``data_received``: no stream reader, no task woken, no timer rescheduled per chunk (the read timeout is one
timer per request that checks the time of the last read). The consumer (the proxy's stream) reads what it
measures from those bytes and forwards them.

Three modules: this one (what a caller holds: the failures, :class:`Response`, a request's bytes),
``upstream_connection`` (one connection: the asyncio protocol, httptools' callbacks, the read timeout) and
``upstream_pool`` (``ConnectionPool``: at most ``limit`` connections (0 = unbounded), opening ones included;
a request beyond it waits, first come first served, for a connection to come back or a slot to free; idle
connections are reused most recent first and closed after ``keepalive_s``).

- Failures are typed by when they happened, which is what the proxy's retry rules need
  (``errors.retry_reason``): :class:`ConnectFailed` (no connection: nothing was sent),
  :class:`ClosedBeforeAnswer` (closed or reset before a complete response head; ``reused`` and whether
  ``partial`` response bytes came), :class:`NoAnswerInTime`, :class:`InvalidResponse`. Each carries
  ``reused``: whether the try ran on a pooled connection.
- :class:`Response`: status and headers, then the body pushed to ``consume(on_data, on_end)`` or read whole
  (``read``); ``release`` gives the connection back once the body has ended, ``close`` drops it (which an
  upstream takes as the client going away: vLLM aborts the request).

The protocol callbacks run on the event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections.abc import Callable
from typing import Protocol

OnData = Callable[[bytes], None]
OnEnd = Callable[["BaseException | None"], None]


class BodySource(Protocol):
    """What a :class:`Response` needs of the connection it arrives on (upstream_connection.Connection); a
    protocol here, so this module, which the connection imports, needs nothing of it."""

    on_data: OnData | None

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class UpstreamHTTPError(Exception):
    """A try that got no usable answer. ``reused``: it ran on a pooled connection."""

    def __init__(self, message: str, *, reused: bool = False) -> None:
        super().__init__(message)
        self.reused = reused


class ConnectFailed(UpstreamHTTPError):
    """No connection could be opened (refused, DNS, connect timeout): the request was never sent."""


class ClosedBeforeAnswer(UpstreamHTTPError):
    """The connection closed or was reset before the response head was complete; ``partial``: some
    response bytes had arrived."""

    def __init__(self, message: str, *, reused: bool, partial: bool) -> None:
        super().__init__(message, reused=reused)
        self.partial = partial


class NoAnswerInTime(UpstreamHTTPError, TimeoutError):
    """No bytes from the upstream within the read timeout."""


class InvalidResponse(UpstreamHTTPError):
    """The upstream sent something that is not an HTTP/1.x response."""


class BrokenBody(UpstreamHTTPError):
    """The body ended before its end (connection closed or reset mid-body); ``on_end`` gets it."""


class Response:
    """One response: ``status``, ``headers`` (names lower-case; a repeated header keeps its last value),
    then the body."""

    __slots__ = ("status", "headers", "reused", "_conn", "_on_data", "_on_end", "_buffer", "_ended", "_error", "_done")

    def __init__(self, conn: BodySource, status: int, headers: dict[str, str], reused: bool) -> None:
        self.status = status
        self.headers = headers
        self.reused = reused
        self._conn = conn
        self._on_data: OnData | None = None
        self._on_end: OnEnd | None = None
        self._buffer: list[bytes] = []
        self._ended = False
        self._error: BaseException | None = None
        self._done = False  # released or closed

    def consume(self, on_data: OnData, on_end: OnEnd) -> None:
        """Hand the body to ``on_data`` (what arrived so far now, then one call per socket read, from the
        protocol's ``data_received``) and its end to ``on_end`` (once: None at the end of the body, a
        :class:`UpstreamHTTPError` when the connection broke, stalled past the read timeout or sent garbage)."""
        self._on_data = on_data
        self._on_end = on_end
        if self._buffer:
            data = b"".join(self._buffer)
            self._buffer.clear()
            on_data(data)
        if not self._done:
            self._conn.on_data = on_data  # from now on the connection calls it without this hop
        if self._ended:
            on_end(self._error)

    async def read(self) -> bytes:
        """The whole body; raises the :class:`UpstreamHTTPError` that cut it short."""
        parts: list[bytes] = []
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def end(error: BaseException | None) -> None:
            if not done.done():
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

        self.consume(parts.append, end)
        await done
        return b"".join(parts)

    @property
    def ended(self) -> bool:
        return self._ended

    def pause_reading(self) -> None:
        """Stop reading from the upstream (back-pressure from a consumer that fell behind)."""
        self._conn.pause_reading()

    def resume_reading(self) -> None:
        self._conn.resume_reading()

    def release(self) -> None:
        """Done with the response: its connection goes back to the pool when the body has ended (now, or when
        its last bytes arrive), else it closes. Idempotent, and a no-op after :meth:`close`."""
        if self._done:
            return
        self._done = True
        self._on_data = self._on_end = None
        self._conn.on_data = None
        self._conn.release()

    def close(self) -> None:
        """Drop the connection (the upstream sees the client go away). Idempotent."""
        if self._done:
            return
        self._done = True
        self._on_data = self._on_end = None
        self._conn.on_data = None
        self._conn.close()

    # called by the connection
    def _data(self, data: bytes) -> None:
        on_data = self._on_data
        if on_data is not None:
            on_data(data)
        elif not self._done:
            self._buffer.append(data)

    def _end(self, error: BaseException | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._error = error
        on_end = self._on_end
        if on_end is not None:
            on_end(error)


def request_bytes(method: str, target: str, authority: str, headers: dict[str, str], body: bytes) -> bytes:
    """One HTTP/1.1 request. Header values come from the proxy and its flags; a line break in one would
    split the request, so it is refused."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r}: line breaks and colons are not allowed")
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def client_tls() -> ssl_module.SSLContext:
    """The TLS context for an https upstream: the system's trust store, hostname checked."""
    return ssl_module.create_default_context()
