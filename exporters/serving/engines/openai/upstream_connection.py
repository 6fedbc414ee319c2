"""One keep-alive connection to the upstream: the asyncio protocol and httptools' callback object.

Each socket read is parsed in ``data_received`` and its body bytes go to the consumer's ``on_data`` in one
call; the read timeout is one timer per request that checks the time of the last read. The pool
(``upstream_pool``) hands connections out and takes them back; :class:`~.upstream_http.Response` is what
the consumer holds.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import httptools

from exporters.serving.engines.openai.upstream_http import (
    BrokenBody,
    ClosedBeforeAnswer,
    InvalidResponse,
    NoAnswerInTime,
    OnData,
    Response,
    UpstreamHTTPError,
)


class Owner(Protocol):
    """What a connection needs of the pool that holds it (upstream_pool.ConnectionPool); a protocol here, so
    this module, which the pool imports, needs nothing of it."""

    loop: asyncio.AbstractEventLoop
    read_timeout_s: float

    def lost(self, conn: Connection) -> None: ...

    def give_back(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time. Also the httptools callback object."""

    def __init__(self, pool: Owner) -> None:
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
