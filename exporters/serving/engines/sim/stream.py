"""The stream a :class:`~.engine.SimEngine` returns for one request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from exporters.serving.engine import OutputEvent, PlainSink, RequestStream, RequestTiming


class SimStream(RequestStream):
    """Events for one request. If the consumer lags, pending events merge into one (as vLLM's output
    collector does), so a slow client never makes the engine queue per-token objects. While the consumer waits
    with nothing pending, an event goes to its sink (``deliver_to``) from the step loop itself."""

    def __init__(self, request_id: str, timing: RequestTiming, on_close: Callable[[str], None]) -> None:
        self.request_id = request_id
        self.timing = timing
        self._on_close = on_close
        """Called with the request id when the consumer closes the stream before it ended (an abort)."""
        self._pending: OutputEvent | None = None
        self._ended = False
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[OutputEvent], bool] | None = None
        self._error: Exception | None = None

    def deliver_to(self, sink: Callable[[OutputEvent], bool], plain: PlainSink | None = None) -> bool:
        self._sink = sink  # the sim builds its own chunks: no forwarded frames, ``plain`` is never used
        return True

    def push(self, event: OutputEvent) -> None:
        sink = self._sink
        waiter = self._waiter
        if sink is not None and self._pending is None and waiter is not None and not waiter.done():
            try:
                taken = sink(event)
            except Exception as exc:  # the HTTP layer's bug: raised to it from __anext__, never into the step loop
                self._error = exc
                waiter.set_result(None)
                return
            if taken:
                if event.finish_reason is not None:
                    self._ended = True
                    waiter.set_result(None)
                return
        pending = self._pending
        if pending is None:
            self._pending = event
        else:
            pending.text += event.text
            pending.new_tokens += event.new_tokens
            pending.output_tokens = event.output_tokens
            pending.finish_reason = event.finish_reason
            pending.stop_reason = event.stop_reason
        if event.finish_reason is not None:
            self._ended = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def __anext__(self) -> OutputEvent:
        while True:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            event = self._pending
            if event is not None:
                self._pending = None
                if event.finish_reason is not None:
                    self._closed = True
                return event
            if self._closed or self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def aclose(self) -> None:
        if not self._ended:
            self._on_close(self.request_id)
        self._ended = self._closed = True
        self._pending = None
        self._sink = None
