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
- **No middleware misses anything**: every wrapper of ``send`` between uvicorn and the response
  (Starlette's ServerErrorMiddleware and exception handler, FastAPI's body-limit and telemetry middlewares,
  ``HttpMetricsMiddleware``, the response's own; for the generation routes served below that stack,
  ``DirectRoutes.serve``'s, direct_routes.py) looks only at ``http.response.start`` and the final body
  message. A middleware that must see every body chunk (compression, byte counting) would miss them: the
  test above fails when the app's middleware list changes, to have that checked.
"""

from __future__ import annotations

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
    """Writes body chunks of one started, chunked, streamed response to uvicorn's transport."""

    __slots__ = ("_cycle", "_flow", "_transport")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        self._flow = cycle.flow
        self._transport = cycle.transport

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

    def writable(self) -> bool:
        """Whether uvicorn's ``send`` would write a body chunk now, without waiting or dropping it."""
        cycle = self._cycle
        return not (cycle.disconnected or cycle.response_complete or self._flow.write_paused)

    def write(self, body: bytes) -> None:
        """One HTTP chunk, as uvicorn frames a body message with ``more_body`` (nothing for an empty body)."""
        if body:
            self._transport.write(b"%x\r\n%b\r\n" % (len(body), body))
