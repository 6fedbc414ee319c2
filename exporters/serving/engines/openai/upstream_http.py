"""The proxy's streaming HTTP/1.1 client: keep-alive connections on bare asyncio protocols.

Built for one job, a generation request forwarded to an OpenAI-compatible upstream, and cheap per chunk:
httptools (llhttp, the C parser uvicorn uses) decodes the response (chunked or sized), and every socket read
ends in **one** call of the consumer's ``on_data`` with the body bytes of that read, straight from
``data_received``: no stream reader, no task woken, no timer rescheduled per chunk (the read timeout is one
timer per request that checks the time of the last read). The consumer (the proxy's stream) reads what it
measures from those bytes and forwards them.

- :class:`ConnectionPool`: at most ``limit`` connections (0 = unbounded), opening ones included; a request
  beyond it waits, first come first served, for a connection to come back or a slot to free. Idle
  connections are reused most recent first and closed after ``keepalive_s``.
- Failures are typed by when they happened, which is what the proxy's retry rules need
  (``engine.retry_reason``): :class:`ConnectFailed` (no connection: nothing was sent),
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
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools

OnData = Callable[[bytes], None]
OnEnd = Callable[["BaseException | None"], None]


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

    def __init__(self, conn: _Connection, status: int, headers: dict[str, str], reused: bool) -> None:
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


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time. Also the httptools callback object."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.slot_moved = False  # its pool slot went to a waiter that needs a new connection
        self.idle_timer: asyncio.TimerHandle | None = None
        # The exchange in progress.
        self._head: asyncio.Future[Response] | None = None
        self._response: Response | None = None
        self._reused = False
        self._got_bytes = False
        self._complete = False
        self._keep_alive = True
        self._close_delimited = False
        self._informational = False
        self._header_list: list[tuple[bytes, bytes]] = []
        self._pieces: list[bytes] = []
        self._last_read = 0.0
        self._stall: asyncio.TimerHandle | None = None
        self._paused = False
        self._release_when_complete = False
        self.on_data: OnData | None = None
        """The consumer's ``on_data`` while it consumes the response in progress."""

    # --- asyncio.Protocol -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        if self._head is None and self._response is None:
            self._fail(InvalidResponse("upstream sent bytes on an idle connection"))
            return
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(InvalidResponse(f"upstream sent an invalid HTTP response: {err}", reused=self._reused))
            return
        pieces = self._pieces
        if pieces:
            body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            on_data = self.on_data
            if on_data is not None:
                on_data(body)
            elif self._response is not None:
                self._response._data(body)
        if self._complete and self._response is not None:
            self._body_ended()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._cancel_timers()
        head = self._head
        if head is not None and not head.done():
            why = f": {exc}" if exc is not None else ""
            head.set_exception(
                ClosedBeforeAnswer(
                    f"upstream closed the connection without answering{why}",
                    reused=self._reused,
                    partial=self._got_bytes,
                )
            )
        response = self._response
        if response is not None and not self._complete:
            if self._close_delimited and exc is None:
                response._end(None)  # a body delimited by the close: this is its end
            else:
                why = f": {exc}" if exc is not None else ""
                response._end(BrokenBody(f"upstream closed the connection mid-response{why}", reused=self._reused))
        self._response = None
        self.on_data = None
        self._pool.lost(self)

    # --- httptools callbacks ----------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_list.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if 100 <= status < 200:
            self._informational = True  # 100 Continue and the like: the real head follows
            self._header_list.clear()
            return
        headers: dict[str, str] = {}
        sized = False
        for name, value in self._header_list:
            key = name.decode("latin-1").lower()
            headers[key] = value.decode("latin-1")
            if key in ("content-length", "transfer-encoding"):
                sized = True
        self._header_list.clear()
        self._keep_alive = bool(parser.should_keep_alive())
        self._close_delimited = not sized and status not in (204, 304)
        response = Response(self, status, headers, self._reused)
        self._response = response
        head = self._head
        self._head = None
        if head is not None and not head.done():
            head.set_result(response)

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self._complete = True

    # --- the exchange -----------------------------------------------------------------------------------

    async def exchange(self, raw: bytes, reused: bool) -> Response:
        """Send one request and wait for its response head. On any failure (or cancellation) the connection
        is closed: what the upstream got is unknown."""
        assert self.transport is not None
        self._reused = reused
        self._got_bytes = False
        self._complete = False
        self._release_when_complete = False
        self._close_delimited = False
        self.on_data = None
        head: asyncio.Future[Response] = self._loop.create_future()
        self._head = head
        self._last_read = self._loop.time()
        self._arm_stall(self._last_read + self._pool.read_timeout_s)
        try:
            self.transport.write(raw)
            return await head
        except BaseException:
            self._head = None
            self.close()
            raise

    def release(self) -> None:
        """The consumer is done: back to the pool once the body has ended."""
        if self._complete:
            self._recycle()
        else:
            self._release_when_complete = True
            self.resume_reading()  # read the rest of the body, to its end

    def _body_ended(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        response = self._response
        if response is not None:
            response._end(None)  # the consumer may release or close right here
        if self._release_when_complete:
            self._recycle()

    def _recycle(self) -> None:
        if self._response is None:
            return  # recycled already, or lost
        self._response = None
        self.on_data = None
        self._release_when_complete = False
        if self._keep_alive and self.usable():
            self._pool.give_back(self)
        else:
            self.close()

    def close(self) -> None:
        self._cancel_timers()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def pause_reading(self) -> None:
        if not self._paused and self.transport is not None and not self.transport.is_closing():
            self._paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._paused:
            self._paused = False
            self._last_read = self._loop.time()  # a paused read is no stall of the upstream's
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    # --- read timeout -----------------------------------------------------------------------------------

    def _arm_stall(self, when: float) -> None:
        if self._stall is not None:
            self._stall.cancel()
        self._stall = self._loop.call_at(when, self._check_stall)

    def _check_stall(self) -> None:
        self._stall = None
        timeout = self._pool.read_timeout_s
        due = self._last_read + timeout
        now = self._loop.time()
        if self._paused or now < due - 0.001:
            self._arm_stall(now + timeout if self._paused else due)
            return
        self._fail(NoAnswerInTime(f"no bytes from the upstream for {timeout:g} s", reused=self._reused))

    def _cancel_timers(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    def _fail(self, error: UpstreamHTTPError) -> None:
        head = self._head
        self._head = None
        if head is not None and not head.done():
            head.set_exception(error)
        response = self._response
        if response is not None and not self._complete:
            response._end(error)
        self.close()


class ConnectionPool:
    """Keep-alive connections to one upstream ``host:port`` (TLS when ``ssl`` is given)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        limit: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.host = host
        self.port = port
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self._ssl = ssl
        self.loop = asyncio.get_running_loop()
        self.open = 0
        """Connections holding a slot: opening, in use, idle."""
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._waiters: deque[tuple[asyncio.Future[_Connection | None], bool]] = deque()
        self._closed = False

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def request(self, raw: bytes, *, fresh: bool = False) -> Response:
        """Send ``raw`` (a whole HTTP/1.1 request) and return the response once its head arrived. ``fresh``:
        on a new connection, never a pooled one. Raises :class:`UpstreamHTTPError`."""
        conn, reused = await self._acquire(fresh)
        return await conn.exchange(raw, reused)

    async def close(self) -> None:
        """Close every connection; waiting requests fail with :class:`ConnectFailed`."""
        self._closed = True
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
        while self._waiters:
            waiter, _ = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectFailed("the proxy is shutting down"))

    # --- slots --------------------------------------------------------------------------------------------

    async def _acquire(self, fresh: bool) -> tuple[_Connection, bool]:
        if self._closed:
            raise ConnectFailed("the proxy is shutting down")
        if not fresh:
            while self._idle:
                conn = self._idle.pop()  # most recently used: the least likely to be closing
                if conn.idle_timer is not None:
                    conn.idle_timer.cancel()
                    conn.idle_timer = None
                if conn.usable():
                    return conn, True
                # closing: its connection_lost frees the slot
        if self.limit == 0 or self.open < self.limit:
            self.open += 1
            return await self._connect(), False
        if fresh and self._idle:
            self._move_slot(self._idle.pop())
            return await self._connect(), False
        waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
        entry = (waiter, fresh)
        self._waiters.append(entry)
        try:
            handed = await waiter
        except asyncio.CancelledError:
            if entry in self._waiters:
                self._waiters.remove(entry)
            elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                got = waiter.result()  # handed over just before the cancellation: pass it on
                if got is None:
                    self._free_slot()
                else:
                    self.give_back(got)
            raise
        if handed is None:  # a slot, reserved for us
            return await self._connect(), False
        return handed, True

    async def _connect(self) -> _Connection:
        """A new connection in a slot already counted in ``open``; the slot is freed if it fails."""
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                ),
                self.connect_timeout_s,
            )  # fmt: skip
        except asyncio.CancelledError:
            self._free_slot()
            raise
        except (OSError, TimeoutError) as err:
            self._free_slot()
            what = f"timed out after {self.connect_timeout_s:g} s" if isinstance(err, TimeoutError) else str(err)
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {what}") from err
        if self._closed:
            conn.close()
            raise ConnectFailed("the proxy is shutting down")
        self._all.add(conn)
        return conn

    def give_back(self, conn: _Connection) -> None:
        """A connection whose exchange ended cleanly: to the first waiter, else idle."""
        if not conn.usable() or self._closed:
            conn.close()
            return
        while self._waiters:
            waiter, fresh = self._waiters.popleft()
            if waiter.done():
                continue
            if fresh:
                self._move_slot(conn)  # it wants a new connection: this one's slot is its
                waiter.set_result(None)
            else:
                waiter.set_result(conn)
            return
        self._idle.append(conn)
        conn.idle_timer = self.loop.call_later(self.keepalive_s, self._expire, conn)

    def _expire(self, conn: _Connection) -> None:
        conn.idle_timer = None
        if conn in self._idle:
            self._idle.remove(conn)
        conn.close()

    def _move_slot(self, conn: _Connection) -> None:
        """Close ``conn`` and keep its slot for whoever called this (its loss will not free it)."""
        conn.slot_moved = True
        if conn.idle_timer is not None:
            conn.idle_timer.cancel()
            conn.idle_timer = None
        conn.close()

    def lost(self, conn: _Connection) -> None:
        """``conn`` closed: its slot is free (unless it was moved)."""
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        if not conn.slot_moved:
            conn.slot_moved = True  # freed once
            self._free_slot()

    def _free_slot(self) -> None:
        while self._waiters:
            waiter, _ = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter: ``open`` is unchanged
                return
        self.open -= 1


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


__all__: list[Any] = [
    "BrokenBody",
    "ClosedBeforeAnswer",
    "ConnectFailed",
    "ConnectionPool",
    "InvalidResponse",
    "NoAnswerInTime",
    "Response",
    "UpstreamHTTPError",
    "client_tls",
    "request_bytes",
]
