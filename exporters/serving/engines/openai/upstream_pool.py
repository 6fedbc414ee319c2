"""The pool of keep-alive connections to one upstream (``upstream_connection``): a bound on connections,
opening ones included; first come first served beyond it; idle ones reused most recent first and closed
after ``keepalive_s``."""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections import deque

from exporters.serving.engines.openai.upstream_connection import Connection
from exporters.serving.engines.openai.upstream_http import ConnectFailed, Response


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
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()
        self._waiters: deque[tuple[asyncio.Future[Connection | None], bool]] = deque()
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

    async def _acquire(self, fresh: bool) -> tuple[Connection, bool]:
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
        waiter: asyncio.Future[Connection | None] = self.loop.create_future()
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

    async def _connect(self) -> Connection:
        """A new connection in a slot already counted in ``open``; the slot is freed if it fails."""
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: Connection(self), self.host, self.port, ssl=self._ssl,
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

    def give_back(self, conn: Connection) -> None:
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

    def _expire(self, conn: Connection) -> None:
        conn.idle_timer = None
        if conn in self._idle:
            self._idle.remove(conn)
        conn.close()

    def _move_slot(self, conn: Connection) -> None:
        """Close ``conn`` and keep its slot for whoever called this (its loss will not free it)."""
        conn.slot_moved = True
        if conn.idle_timer is not None:
            conn.idle_timer.cancel()
            conn.idle_timer = None
        conn.close()

    def lost(self, conn: Connection) -> None:
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
