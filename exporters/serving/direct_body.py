"""Streamed response chunks written straight to uvicorn's transport, from the engine's own callback.

A streamed generation normally sends each chunk as an ASGI ``http.response.body`` message: the producing
task wakes, and the message passes five wrappers (ours, FastAPI's, Starlette's) before uvicorn frames it as
an HTTP chunk and writes it. That wake-up and that chain cost more than the chunk's own work, so engines that
make their events in a callback of their own (the proxy in its socket's ``data_received``, the sim in its
step loop) hand them over there (``RequestStream.deliver_to``), and :class:`DirectBody` writes the chunk,
exactly as uvicorn's ``send`` would.

Why that is safe, and when it is not used:

- **Only uvicorn's httptools protocol**: the app keeps the server's own ``send`` in the scope
  (:data:`SERVER_SEND`, app.py); this applies only when it is a bound ``send`` of
  ``uvicorn.protocols.http.httptools_impl.RequestResponseCycle``, the one implementation whose ``send`` this
  mirrors (h11, another server, or a wrapper such as uvicorn's trace-level message logger: the ASGI path).
- **Same bytes**: after the response head, with chunked transfer encoding (a streamed response carries no
  ``Content-Length``), uvicorn's ``send`` writes a body message with ``more_body`` as
  ``b"%x\\r\\n" % len(body) + body + b"\\r\\n"`` and changes no state. :meth:`DirectBody.write` writes the
  same bytes (``tests/serving/test_direct_body.py`` compares the two paths byte for byte).
- **Only when uvicorn would write at once**: :meth:`DirectBody.writable` is false when uvicorn's ``send``
  would first wait (writes paused by a full socket buffer: flow control) or drop the message (client
  disconnected, response complete). Then the chunk takes the ASGI path, which waits or drops as before.
- **Never interleaved with the ASGI path**: the stream calls the sink only while the producing task waits in
  ``__anext__`` with nothing queued (``RequestStream.deliver_to``), so no ASGI send of that response is in
  flight; the response head and its last message always go through ASGI, so uvicorn's completion, keep-alive
  and the middlewares' start/end hooks all run.
- **Batched for the proxy** (``RequestStream.batched_writes``): a chunk made in an upstream socket's read is
  held in the loop's :class:`WriteBatch` and written with the other chunks of the same pass over the ready
  sockets, by the loop's next callback, before anything queued after it (so before that response's next
  ASGI message); same bytes, same order, a chunk of a client that left meanwhile dropped as ``send`` drops it.
  One write after another wakes the client's process once instead of once per chunk (:class:`WriteBatch`).
- **No middleware misses anything**: every wrapper of ``send`` between uvicorn and the response
  (Starlette's ServerErrorMiddleware and exception handler, FastAPI's body-limit and telemetry middlewares,
  ``HttpMetricsMiddleware``, the response's own; for the generation routes served below that stack,
  ``DirectRoutes.serve``'s, direct_routes.py) looks only at ``http.response.start`` and the final body
  message. A middleware that must see every body chunk (compression, byte counting) would miss them: the
  test above fails when the app's middleware list changes, to have that checked.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from starlette.types import Scope

_Cycle: Any
try:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as _Cycle
except ImportError:  # pragma: no cover - uvicorn[standard] ships httptools
    _Cycle = None

SERVER_SEND = "loadlens.server_send"
"""Scope key: the ASGI ``send`` the server called the app with, before any middleware wrapped it."""


class DirectBody:
    """Writes body chunks of one started, chunked, streamed response to uvicorn's transport; with a
    :class:`WriteBatch`, at the end of the loop's pass over its ready sockets instead of at once."""

    __slots__ = ("_batch", "_cycle", "_flow", "_held", "_transport")

    def __init__(self, cycle: Any, batch: WriteBatch | None = None) -> None:
        self._cycle = cycle
        self._flow = cycle.flow
        self._transport = cycle.transport
        self._batch = batch
        self._held = False  # a chunk of this response waits in the batch

    @classmethod
    def of(cls, scope: Scope) -> DirectBody | None:
        """The writer for this request's response, once its head went out; None when the rules above do not
        hold (then every chunk takes the ASGI path)."""
        cycle: Any = getattr(scope.get(SERVER_SEND), "__self__", None)
        if _Cycle is None or type(cycle) is not _Cycle:
            return None
        if not (cycle.response_started and cycle.chunked_encoding is True and scope.get("method") != "HEAD"):
            return None
        return cls(cycle)

    def batched(self) -> DirectBody:
        """This response's writer whose chunks wait for the running loop's :class:`WriteBatch`."""
        return DirectBody(self._cycle, WriteBatch.of_running_loop())

    def writable(self) -> bool:
        """Whether uvicorn's ``send`` would write a body chunk now, without waiting or dropping it (batched:
        and no chunk of this response waits in the batch, whose write could fill the socket's buffer)."""
        cycle = self._cycle
        return not (self._held or cycle.disconnected or cycle.response_complete or self._flow.write_paused)

    def write(self, body: bytes) -> None:
        """One HTTP chunk, as uvicorn frames a body message with ``more_body`` (nothing for an empty body)."""
        if body:
            batch = self._batch
            if batch is None:
                self._transport.write(b"%x\r\n%b\r\n" % (len(body), body))
                return
            held = batch._held
            if not held:
                batch._call_soon(batch._flush)
            self._held = True
            held.append((self, b"%x\r\n%b\r\n" % (len(body), body)))


_BATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WriteBatch] = weakref.WeakKeyDictionary()


class WriteBatch:
    """The chunks that batched :class:`DirectBody` writers wrote during one pass of an event loop, written
    to their sockets together by one callback of the loop's next pass (``call_soon``), in the order they came.

    Why: the proxy makes each chunk in the callback of its upstream socket's read, a few microseconds of
    Python apart. Written at once, each chunk tends to find the client's process asleep again and costs a
    wake-up of it (an inter-processor interrupt when it runs on another CPU), which is more CPU in the proxy
    than the chunk's own Python (BENCHMARKS.md, issue 21's fifth step). Written together after the pass over
    the ready sockets, one wake-up serves them all, as it does for a relay that does no work between them.

    Order and the ASGI path: the callback is queued at the pass's first held chunk, before anything a later
    read queues (a consumer's wake-up, hence its next ASGI ``send``), and the loop runs its callbacks in
    order: a response's held chunks are written before its next message through ASGI. A writer with a held
    chunk is not :meth:`DirectBody.writable` (its next chunk takes the ASGI path, which comes after)."""

    __slots__ = ("_call_soon", "_flush", "_held", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._held: list[tuple[DirectBody, bytes]] = []  # (writer, its framed chunk), in order
        self._call_soon = loop.call_soon
        self._flush = self.flush

    @classmethod
    def of_running_loop(cls) -> WriteBatch:
        loop = asyncio.get_running_loop()
        batch = _BATCHES.get(loop)
        if batch is None:
            batch = _BATCHES[loop] = cls(loop)
        return batch

    def flush(self) -> None:
        """Write every held chunk, in order; one whose client left meanwhile is dropped, as uvicorn's ``send``
        drops it (a write that raises is reported to the loop's exception handler; the others are written).
        One whose response was completed meanwhile is not written either (bytes after the terminating chunk
        would corrupt the connection's next response) and is reported, as uvicorn's ``send`` raises for a
        body message after the response's end; the order above means it never happens."""
        held, self._held = self._held, []
        for direct, data in held:
            direct._held = False
            cycle = direct._cycle
            if cycle.disconnected:
                continue
            if cycle.response_complete:
                self._loop.call_exception_handler({"message": "a batched response chunk came after its response's end"})
                continue
            try:
                direct._transport.write(data)
            except Exception as exc:  # uvicorn's transport raises only once closed, after the client left
                self._loop.call_exception_handler(
                    {"message": "a batched response chunk could not be written", "exception": exc}
                )
