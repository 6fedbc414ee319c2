"""One admitted generation request on the wire: streamed as SSE or returned whole, aborted in the engine
when the client goes away. The routes (app.py) hand every admitted request to :class:`GenerationResponse`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from exporters.serving.direct_body import DirectBody
from exporters.serving.engine import EngineError, OutputEvent, RequestStream
from exporters.serving.errors import (
    INTERNAL,
    engine_error_reason,
    engine_error_response,
    engine_error_status,
    internal_error_message,
    log_internal_error,
    sse_error_event,
)
from exporters.serving.lifecycle import RequestLifecycle
from exporters.serving.protocol import ParsedRequest
from exporters.serving.responses import DONE, ChunkWriter, full_response
from loadlens.util.openai_errors import error_response


class GenerationResponse(Response):
    """Runs one admitted request to completion, streaming (SSE) or not, and aborts it if the client leaves.

    A watcher task waits for ``http.disconnect`` and cancels the producing task; the producer then aborts
    the request in the engine (freeing its slot and KV blocks) and records it as a client abort (499).
    """

    def __init__(self, life: RequestLifecycle, stream: RequestStream, parsed: ParsedRequest, model: str) -> None:
        self.life = life
        self.engine_stream = stream
        self.parsed = parsed
        self.model = model
        self.background = None
        self._finished_producing = False
        self._client_gone = False
        self._scope: Scope = {}
        self.status_code = 200

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._scope = scope
        producer = asyncio.current_task()
        assert producer is not None

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not self._finished_producing:
                        self._client_gone = True
                        producer.cancel()
                    return

        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        watcher = asyncio.create_task(watch())
        try:
            if self.parsed.stream:
                await self._stream(tracked_send)
            else:
                await self._whole(tracked_send)
        except asyncio.CancelledError:
            if not self._client_gone:
                raise
            producer.uncancel()
            await self.engine_stream.aclose()
            self.life.finish_abort("client_disconnect", self.engine_stream.timing)
        except Exception as exc:
            if self.life.done:
                raise
            await self._internal_error(exc, started, tracked_send)
        finally:
            watcher.cancel()
            if not self.life.done:
                # Server shutdown or an unexpected exception: never leave the engine slot held.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.engine_stream.aclose())
                self.life.finish_abort("shutdown", self.engine_stream.timing)

    async def _stream(self, send: Send) -> None:
        p = self.parsed
        life = self.life
        writer = ChunkWriter(p.endpoint, self._response_id(), self.model, int(time.time()), p.continuous_usage_stats)
        out = _Streamed(life, writer, sent_role=p.endpoint != "chat")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-request-id", life.request_id.encode()),
                ],
            }
        )
        direct = DirectBody.of(self._scope)
        if direct is not None:
            # Engines that read from a socket hand events over from their read callback: recorded and
            # written there, with no task wake-up (direct_body.py says why writing there is safe).
            out.attach(self.engine_stream, direct)
        try:
            async for ev in self.engine_stream:
                body = out.take(ev)
                if body is not None:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
        except EngineError as err:
            self._finished_producing = True
            status = engine_error_status(err)
            # Recorded before the last bytes go out: whoever has the response also sees it counted.
            life.finish_error(status, engine_error_reason(err), err.message, self.engine_stream.timing)
            await send({"type": "http.response.body", "body": sse_error_event(status, err.message), "more_body": True})
            await send({"type": "http.response.body", "body": DONE, "more_body": False})
            return
        tail = DONE
        if p.include_usage and not out.saw_wire:
            tail = writer.usage(life.prompt_tokens, life.output_tokens, out.cached) + DONE
        self._finished_producing = True
        life.finish_ok(out.finish_reason, self.engine_stream.timing, out.cached)
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _collect(self) -> tuple[str, str | None, str | None, int, OutputEvent | None]:
        """A non-streamed generation read to its end: (text, finish reason, stop reason, cached prompt tokens,
        the event carrying the engine's whole answer or None), each event recorded as it arrives. Raises the
        engine's EngineError."""
        life = self.life
        parts: list[str] = []
        finish_reason: str | None = None
        stop_reason: str | None = None
        cached = 0
        whole: OutputEvent | None = None
        async for ev in self.engine_stream:
            if ev.whole_body is not None:
                life.on_whole(ev.prompt_tokens, ev.output_tokens)
                whole = ev
            else:
                life.on_event(time.monotonic(), ev.new_tokens, ev.prompt_tokens, ev.output_tokens)
            if ev.text:
                parts.append(ev.text)
            if ev.finish_reason is not None:
                finish_reason, stop_reason = ev.finish_reason.value, ev.stop_reason
            cached = ev.cached_tokens or cached
        return "".join(parts), finish_reason, stop_reason, cached, whole

    async def _whole(self, send: Send) -> None:
        life = self.life
        try:
            text, finish_reason, stop_reason, cached, whole = await self._collect()
        except EngineError as err:
            await self._refuse_whole(err, send)
            return
        if whole is not None and whole.whole_body is not None:
            # The engine's own answer (a proxy's upstream body): sent as it came.
            payload, content_type = whole.whole_body, whole.whole_content_type or "application/json"
        else:
            body = full_response(
                self.parsed.endpoint,
                self._response_id(),
                self.model,
                int(time.time()),
                text,
                finish_reason,
                stop_reason,
                life.prompt_tokens,
                life.output_tokens,
                cached,
            )
            payload, content_type = json.dumps(body).encode(), "application/json"
        self._finished_producing = True
        life.finish_ok(finish_reason, self.engine_stream.timing, cached)
        await send_json(send, payload, life.request_id, content_type)

    async def _refuse_whole(self, err: EngineError, send: Send) -> None:
        """An engine error before a non-streamed response started: counted, then its error response."""
        self._finished_producing = True
        response = engine_error_response(err)
        self.life.finish_error(response.status_code, engine_error_reason(err), err.message, self.engine_stream.timing)
        await response({"type": "http"}, _no_receive, send)

    async def _internal_error(self, exc: Exception, started: bool, send: Send) -> None:
        """A bug in loadlens or an engine crash mid-request: counted as 500, logged with the trace id, and
        told to the client as an error event (stream started) or a 500 body, as an engine error would be."""
        self._finished_producing = True
        life = self.life
        message = internal_error_message(exc, life.trace_id)
        life.finish_error(500, INTERNAL.reason, f"{type(exc).__name__}: {exc}", self.engine_stream.timing)
        log_internal_error(exc, life.trace_id, f"POST {life.path}")
        with contextlib.suppress(Exception):
            await asyncio.shield(self.engine_stream.aclose())
        with contextlib.suppress(OSError, RuntimeError):
            if started:
                await send({"type": "http.response.body", "body": sse_error_event(500, message), "more_body": True})
                await send({"type": "http.response.body", "body": DONE, "more_body": False})
            else:
                await error_response(500, message)({"type": "http"}, _no_receive, send)

    def _response_id(self) -> str:
        prefix = "chatcmpl-" if self.parsed.endpoint == "chat" else "cmpl-"
        return prefix + self.life.request_id


class _Streamed:
    """What one streamed response has counted and sent. :meth:`take` is the work per output event: record
    it, then the bytes to write; the streaming loop and the engine's direct delivery share it."""

    __slots__ = ("cached", "finish_reason", "life", "saw_wire", "sent_role", "writer")

    def __init__(self, life: RequestLifecycle, writer: ChunkWriter, *, sent_role: bool) -> None:
        self.life = life
        self.writer = writer
        self.sent_role = sent_role
        self.saw_wire = False
        self.finish_reason: str | None = None
        self.cached = 0

    def take(self, ev: OutputEvent) -> bytes | None:
        """Record one event; the body to send for it, None when it sends nothing."""
        self.life.on_event(time.monotonic(), ev.new_tokens, ev.prompt_tokens, ev.output_tokens)
        if ev.finish_reason is not None:
            self.finish_reason = ev.finish_reason.value
        self.cached = ev.cached_tokens or self.cached
        body = ev.wire_frames
        if body is not None:
            self.saw_wire = True
            return body or None  # empty: the engine holds this event's frames back for a later event
        if ev.new_tokens == 0 and not ev.text and ev.finish_reason is None and ev.role is None:
            return None  # a counts-only event (e.g. the proxy's final usage the client did not ask for)
        if ev.role is not None:
            return None  # the role chunk is sent with the first content below, as vLLM does
        writer = self.writer
        body = writer.content(
            ev.text,
            ev.prompt_tokens,
            ev.output_tokens,
            ev.finish_reason.value if ev.finish_reason is not None else None,
            ev.stop_reason,
        )
        if not self.sent_role:
            body = writer.role(ev.prompt_tokens) + body
            self.sent_role = True
        return body

    def attach(self, stream: RequestStream, direct: DirectBody) -> None:
        """Have ``stream`` hand its events to :meth:`deliver` and :meth:`deliver_plain`, written by ``direct``
        (batched for a stream that makes them in socket reads: ``RequestStream.batched_writes``)."""
        if stream.batched_writes:
            direct = direct.batched()
        stream.deliver_to(functools.partial(self.deliver, direct), functools.partial(self.deliver_plain, direct))

    def deliver(self, direct: DirectBody, ev: OutputEvent) -> bool:
        """The sink for ``RequestStream.deliver_to``: take the event and write its body now, if uvicorn would
        (else False: the event goes the ASGI way, from the loop)."""
        if not direct.writable():
            return False
        body = self.take(ev)
        if body is not None:
            direct.write(body)
        return True

    def deliver_plain(self, direct: DirectBody, frames: bytes, prompt_tokens: int, output_tokens: int) -> bool:
        """The ``plain`` sink for ``RequestStream.deliver_to``: :meth:`deliver` of ``OutputEvent("", 1,
        prompt_tokens, output_tokens, wire_frames=frames)``, without the event (what :meth:`take` does with
        it: record one token, no finish, no cached count; the frames are the body)."""
        if not direct.writable():
            return False
        self.life.on_event(time.monotonic(), 1, prompt_tokens, output_tokens)
        self.saw_wire = True
        direct.write(frames)
        return True


async def admit_unless_client_leaves(
    receive: Receive, admission: Awaitable[RequestStream], pending: Callable[[], None]
) -> RequestStream | None:
    """Await an engine's admission of a non-streamed request, or the client going away first (None; the
    admission is cancelled). A proxy relaying a non-streamed answer admits only when the upstream has
    answered, the whole generation later: the client may leave before, and the upstream must hear of it.
    ``pending`` is called when the admission did not end in its first step (the request is then in flight
    meanwhile); an engine that admits or refuses at once (the sim) never waits here."""
    admit = asyncio.ensure_future(admission)
    try:
        await asyncio.sleep(0)  # the admission's first step runs before this resumes (the ready queue is FIFO)
    except asyncio.CancelledError:
        admit.cancel()
        raise
    if admit.done():
        return admit.result()
    pending()

    async def left() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    gone = asyncio.ensure_future(left())
    try:
        await asyncio.wait((admit, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not admit.done():
            admit.cancel()  # the client left, or this request was cancelled (shutdown)
    if admit.done() and not admit.cancelled():
        return admit.result()
    try:
        late = await admit  # admitted as it was being cancelled: nobody will read it
    except (asyncio.CancelledError, EngineError):
        return None
    await late.aclose()
    return None


async def send_json(send: Send, payload: bytes, request_id: str, content_type: str = "application/json") -> None:
    """A whole 200 JSON response (a non-streamed generation) with the request id."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", content_type.encode("latin-1")),
                (b"content-length", str(len(payload)).encode()),
                (b"x-request-id", request_id.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}
