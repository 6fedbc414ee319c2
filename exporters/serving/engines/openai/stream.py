"""One proxied request's stream: delivery of the upstream's reads to the HTTP layer, and back-pressure.

The connection calls :meth:`ProxyStream.on_data` with each read's body bytes, from the socket callback. The
stream has them read by its :class:`~exporters.serving.engines.openai.frames.FrameReader` (what they carry),
stamps the times (first token, finish, progress marks for LoRA blocking) and hands the event to the HTTP
layer's sink while the consumer waits with nothing queued, else queues it for ``__anext__``. A consumer that
falls behind ``_BACKLOG_BYTES`` stops the upstream's reads until it catches up. Errors and the end always come
from ``__anext__``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from exporters.serving.engine import (
    EngineError,
    ErrorKind,
    GenerationRequest,
    OutputEvent,
    PlainSink,
    RequestStream,
    RequestTiming,
)
from exporters.serving.engines.openai.errors import upstream_error
from exporters.serving.engines.openai.frames import FrameReader
from exporters.serving.engines.openai.swap_windows import SwapWindows, progress_marks
from exporters.serving.engines.openai.upstream_http import Response

_BACKLOG_BYTES = 2**16
"""Upstream bytes a stream queues for a consumer that fell behind before it stops reading the upstream."""


class ProxyStream(RequestStream):
    """One upstream SSE response, read as raw bytes, each read into one event (``frames.py``)."""

    batched_writes = True  # one read's chunk at a time, from the socket callback

    def __init__(
        self,
        response: Response,
        request: GenerationRequest,
        upstream: str,
        windows: SwapWindows | None = None,
        on_failure: Callable[[str], None] | None = None,
        table: dict[str, ProxyStream] | None = None,
        on_token_source: Callable[[str], None] | None = None,
    ) -> None:
        self.request_id = request.request_id
        self._table = table  # the engine's streams in flight: left on aclose, which every ending reaches
        self._upstream = upstream
        self.timing = RequestTiming()
        self._response = response
        self._frames = FrameReader.for_request(request, upstream)
        self._feed = self._frames.feed  # bound once: called per read
        # Events the consumer has not taken yet (read while it was busy), and the push path
        # (deliver_to): the sink takes events straight from the upstream read while the consumer waits.
        self._events: deque[OutputEvent] = deque()
        self._backlog = 0
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[OutputEvent], bool] | None = None
        self._plain: PlainSink | None = None  # the sink for a plain content read, without its event
        self._broken: tuple[str | None, BaseException] | None = None
        self._eof = False
        self._eof_error: BaseException | None = None
        self._on_failure = on_failure
        self._on_token_source = on_token_source
        self._on_close: Callable[[tuple[int, int] | None], None] | None = None
        self._closed = False
        self._windows = windows if windows is not None else SwapWindows()
        self._marks = progress_marks(request.arrival_time)  # admission, then each read carrying tokens

    def deliver_to(self, sink: Callable[[OutputEvent], bool], plain: PlainSink | None = None) -> bool:
        self._sink = sink
        self._plain = plain
        return True

    def on_data(self, data: bytes) -> None:
        """One upstream read (the body bytes the connection decoded from it), called from the protocol's
        ``data_received``: read into one event, handed to the sink when the consumer waits with nothing
        queued, else queued for :meth:`__anext__`. The most common read, one plain content chunk
        (``FrameReader.plain``), goes to the ``plain`` sink without its event being made, when it can."""
        frames = self._frames
        if frames.ended or self._closed or self._broken is not None:
            return
        plain = self._plain
        waiter = self._waiter
        if plain is not None and waiter is not None and not self._events and not waiter.done() and frames.plain(data):
            # What the general path below does with this read's event (one token, no finish), in its order:
            # the progress marks, then the sink, the event queued only if the sink does not take it.
            now = time.monotonic()
            if self._windows.in_flight:
                asyncio.get_running_loop().call_soon(self._stamp)
            else:
                self._marks.append(now)
            if self.timing.first_token is None:
                self.timing.first_token = now
            try:
                if plain(data, frames.prompt_tokens, frames.output_tokens):
                    return
            except Exception as exc:  # a bug past the engine: raised to the HTTP layer, which counts a 500
                self._break(None, exc)
                return
            self._queue(OutputEvent("", 1, frames.prompt_tokens, frames.output_tokens, wire_frames=data), data)
            return
        try:
            event = self._feed(data)
            if event is not None and (event.new_tokens or event.finish_reason is not None):
                self._progress(event)
        except EngineError as err:
            self._break("bad_stream", err)
            return
        except Exception as exc:  # a bug here: the HTTP layer counts a 500, as it would from __anext__
            self._break(None, exc)
            return
        if event is not None:
            sink = self._sink
            waiter = self._waiter
            if sink is not None and waiter is not None and not waiter.done() and not self._events:
                try:
                    taken = sink(event)
                except Exception as exc:  # a bug past the engine: raised to the HTTP layer, which counts a 500
                    self._break(None, exc)
                    return
                if taken:
                    if frames.ended:
                        self._wake()
                    return
            self._queue(event, data)
        elif frames.ended:
            self._wake()

    def _queue(self, event: OutputEvent, data: bytes) -> None:
        """Queue a read's event for ``__anext__`` (stopping the upstream's reads past the backlog)."""
        self._events.append(event)
        self._backlog += len(data)
        if self._backlog > _BACKLOG_BYTES:
            self._response.pause_reading()
        self._wake()

    def on_end(self, error: BaseException | None) -> None:
        """The upstream body ended: None at its end, else what broke it."""
        self._eof = True
        self._eof_error = error
        self._wake()

    def _progress(self, event: OutputEvent) -> None:
        """A read carrying tokens or the finish, stamped on arrival: a progress mark, and the first token's and
        the finish's times. While a forwarded swap call is in flight the mark is stamped instead when a task
        woken by this read would run: after the loop's callbacks already due, the call's own end among them,
        so a token that arrived with the call's answer never counts as before it (swap_windows.py attributes
        by that order)."""
        now = time.monotonic()
        if self._windows.in_flight:
            asyncio.get_running_loop().call_soon(self._stamp)
        else:
            self._marks.append(now)
        if event.new_tokens and self.timing.first_token is None:
            self.timing.first_token = now
        if event.finish_reason is not None:
            self.timing.finished = now

    def _stamp(self) -> None:
        self._marks.append(time.monotonic())

    def _break(self, reason: str | None, error: BaseException) -> None:
        self._broken = (reason, error)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def __anext__(self) -> OutputEvent:
        while True:
            if self._events:
                event = self._events.popleft()
                if not self._events and self._backlog:
                    self._backlog = 0
                    self._response.resume_reading()
                return event
            if self._broken is not None:
                reason, error = self._broken
                if reason is None:
                    await self.aclose()
                else:
                    await self._fail(reason)
                raise error
            if self._frames.ended:
                await self.aclose()
                raise StopAsyncIteration
            if self._eof:
                if self._frames.finished:  # finished, then ended without [DONE]: nothing is missing
                    held = self._frames.take_held()
                    if held is not None:  # the finishing chunk, waiting for a fingerprint that never came
                        frames = self._frames
                        return OutputEvent("", 0, frames.prompt_tokens, frames.output_tokens, wire_frames=held)
                    await self.aclose()
                    raise StopAsyncIteration
                cause = self._eof_error
                if cause is None:
                    self.timing.finished = time.monotonic()
                    await self._fail("stream_broken")
                    raise upstream_error(self._upstream, "upstream closed the stream before finishing")
                await self._fail("stream_broken")
                raise upstream_error(self._upstream, f"upstream stream broke: {cause}") from cause
            if self._closed:
                raise EngineError(ErrorKind.UNAVAILABLE, "the proxy closed the stream (shutdown or abort)")
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def on_close(self, callback: Callable[[tuple[int, int] | None], None]) -> None:
        """``callback`` gets (prompt, output tokens) when a finished stream closes, None when one that did not
        finish closes (the MFU estimate, ``mfu.py``)."""
        self._on_close = callback

    async def _fail(self, reason: str) -> None:
        if self._on_failure is not None:
            self._on_failure(reason)
        await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sink = self._plain = None
        self._wake()  # a consumer waiting on a stream closed under it (abort, shutdown) ends
        if self._table is not None:
            self._table.pop(self.request_id, None)
        self.timing.lora_blocked_seconds += self._windows.blocked(self._marks)  # before finish_ok reads it
        finished = self._frames.finished
        if finished and self._on_token_source is not None:
            self._on_token_source(self._frames.source or "chunks")
        if self._on_close is not None:
            self._on_close((self._frames.prompt_tokens, self._frames.output_tokens) if finished else None)
        # Closing (not releasing) the connection tells the upstream to abort the request, as a client
        # disconnect would; vLLM frees the slot and KV blocks on that.
        if not finished:
            self._response.close()
        else:
            self._response.release()
