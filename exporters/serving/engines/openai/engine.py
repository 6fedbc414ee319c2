"""The ``openai`` engine: a transparent proxy to any OpenAI-compatible upstream (vllm serve, sglang,
llama.cpp server, text-generation-inference, another loadlens).

- Streams without buffering and without re-encoding: each read of the upstream connection becomes one event
  whose ``wire_frames`` are the upstream's SSE frames as they came (several when the proxy fell behind: one
  write). Token counts, finish reason and usage are read from the bytes; ``json.loads`` only for the few
  chunks that need it. The proxy always asks for the final usage chunk (exact token totals) and forwards it
  only to clients that asked for it.
- Generation requests go over ``upstream_http`` (keep-alive connections on bare asyncio protocols): each read
  is turned into its event inside the socket callback and handed to the HTTP layer there
  (``RequestStream.deliver_to``), which writes it to the client without waking a task. Model lists, health and
  adapter calls use aiohttp.
- Non-streaming client requests are streamed from the upstream too, so the proxy measures time to first token
  for them as well; the HTTP layer assembles the JSON body.
- The upstream's kind (``--upstream-kind``, detected with ``auto``; ``upstream_kinds.py``) decides which
  adapter endpoints it has (or that it has none: 501) and where its context length comes from.
- Upstream errors keep their status and body. The proxy answers for itself only when the upstream could not be
  used: 503 unreachable, 502 closed without answering / broken stream, 504 no answer in time, each counted by
  reason; a try that provably never reached the upstream (a stale keep-alive connection) is sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from exporters.serving.engine import (
    Engine,
    EngineError,
    ErrorKind,
    FinishReason,
    GenerationRequest,
    Health,
    LoRARequest,
    ModelCard,
    OutputEvent,
    RequestStream,
    RequestTiming,
)
from exporters.serving.engines.openai import upstream_http, upstream_kinds
from exporters.serving.engines.openai.swap_windows import SwapWindows, progress_marks
from exporters.serving.engines.openai.upstream_pool import ConnectionPool
from loadlens.util import sse

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_FINISH = {r.value: r for r in FinishReason}
_log = logging.getLogger("loadlens.serve")
# Headers the proxy must not forward: hop-by-hop ones, and the body-describing ones aiohttp recomputes.
_DROP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "accept-encoding"}


def _error_body(raw: bytes) -> Mapping[str, Any] | None:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


# What aiohttp and the streaming client raise when the upstream cannot be reached or stops answering.
_UNREACHABLE = (aiohttp.ClientError, upstream_http.UpstreamHTTPError, TimeoutError, OSError)
_BACKLOG_BYTES = 2**16
"""Upstream bytes a stream queues for a consumer that fell behind before it stops reading the upstream."""


def upstream_error(
    upstream: str, failure: int | BaseException | str, *, raw: bytes = b"", retry_after: str | None = None
) -> EngineError:
    """The one translation of an upstream failure into an EngineError, by what ``failure`` is:

    - an ``int``: the upstream answered with this non-200 status. Kept, with the upstream's message and its
      JSON body (``raw``) forwarded as they are, and ``Retry-After`` when given.
    - an exception: the request never got an answer (connection refused, DNS, timeout): 503.
    - a ``str``: an accepted stream went wrong (broken, cut short, bad JSON, an error event), described by
      the string: 502, since a gateway is what failed the client.
    """
    if isinstance(failure, int):
        parsed = _error_body(raw)
        return EngineError(
            ErrorKind.UPSTREAM,
            _error_message(parsed, failure, raw),
            status=failure,
            body=parsed,
            retry_after_seconds=float(retry_after)
            if retry_after and retry_after.replace(".", "", 1).isdigit()
            else None,
        )
    if isinstance(failure, BaseException):
        return EngineError(ErrorKind.UNAVAILABLE, f"upstream {upstream} unreachable: {failure}")
    return EngineError(ErrorKind.UPSTREAM, failure, status=502)


def _error_message(body: Mapping[str, Any] | None, status: int, raw: bytes) -> str:
    if body is not None:
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str) and err:
            return err  # TGI: {"error": "...", "error_type": "..."}
        for key in ("message", "error_message"):  # sglang's adapter calls: {"success": false, "error_message"}
            if isinstance(body.get(key), str) and body[key]:
                return str(body[key])
    text = raw[:200].decode("utf-8", "replace").strip()
    return f"upstream returned HTTP {status}" + (f": {text}" if text else "")


class _ProxyStream(RequestStream):
    """One upstream SSE response, read as raw bytes.

    Each read takes whatever the upstream connection has buffered (one chunk, or several when the proxy fell
    behind) and turns it into **one** event: the complete SSE frames, forwarded as they came in one write
    (``wire_frames``), plus the token count, finish reason and usage read from them by byte search. Only the
    few chunks that need more go through ``json.loads``: the finishing chunk, the usage-only chunk, a chunk
    with usage the client did not ask for (stripped), anything not compact JSON.
    """

    def __init__(
        self,
        response: upstream_http.Response,
        request: GenerationRequest,
        upstream: str,
        windows: SwapWindows | None = None,
        on_failure: Callable[[str], None] | None = None,
        table: dict[str, _ProxyStream] | None = None,
        on_token_source: Callable[[str], None] | None = None,
    ) -> None:
        self.request_id = request.request_id
        self._table = table  # the engine's streams in flight: left on aclose, which every ending reaches
        self._upstream = upstream
        self.timing = RequestTiming()
        self._response = response
        # Events the consumer has not taken yet (read while it was busy), and the push path
        # (deliver_to): the sink takes events straight from the upstream read while the consumer waits.
        self._events: deque[OutputEvent] = deque()
        self._backlog = 0
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[OutputEvent], bool] | None = None
        self._broken: tuple[str | None, BaseException] | None = None
        self._eof = False
        self._eof_error: BaseException | None = None
        self._endpoint = request.endpoint
        self._chat = request.endpoint == "chat"
        self._text_key = b'"content"' if self._chat else b'"text"'
        options = request.body.get("stream_options") or {}
        self._keep_usage = bool(options.get("continuous_usage_stats"))
        self._keep_final_usage = bool(options.get("include_usage"))
        self._client_streams = request.stream_requested
        self._on_failure = on_failure
        self._on_token_source = on_token_source
        # Where this stream's token counts came from (TOKEN_SOURCES): "usage" once a content chunk carried a
        # running count, "final_usage" once a total came after content without one; None: content chunks.
        self._source: str | None = None
        self._content_chunks = 0
        self._prompt_tokens = 0
        self._output_tokens = 0
        self._finished = False
        self._ended = False  # [DONE] seen
        self._closed = False
        self._buf = b""
        # Per read: what the frames of this read carried.
        self._tokens = 0
        self._texts: list[str] = []
        self._finish: FinishReason | None = None
        self._stop_reason: str | None = None
        self._windows = windows if windows is not None else SwapWindows()
        self._marks = progress_marks(request.arrival_time)  # admission, then each read carrying tokens

    def deliver_to(self, sink: Callable[[OutputEvent], bool]) -> bool:
        self._sink = sink
        return True

    def on_data(self, data: bytes) -> None:
        """One upstream read (the body bytes ``upstream_http`` decoded from it), called from the protocol's
        ``data_received``: read into one event, handed to the sink when the consumer waits with nothing
        queued, else queued for :meth:`__anext__`."""
        if self._ended or self._closed or self._broken is not None:
            return
        try:
            event = self._feed(data)
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
                    if self._ended:
                        self._wake()
                    return
            self._events.append(event)
            self._backlog += len(data)
            if self._backlog > _BACKLOG_BYTES:
                self._response.pause_reading()
            self._wake()
        elif self._ended:
            self._wake()

    def on_end(self, error: BaseException | None) -> None:
        """The upstream body ended: None at its end, else what broke it."""
        self._eof = True
        self._eof_error = error
        self._wake()

    def _mark(self, now: float) -> None:
        """A progress mark: a read carrying tokens (or the finish), stamped on arrival. While a forwarded swap
        call is in flight it is stamped instead when a task woken by this read would run: after the loop's
        callbacks already due, the call's own end among them, so a token that arrived with the call's answer
        never counts as before it (swap_windows.py attributes by that order)."""
        if self._windows.in_flight:
            asyncio.get_running_loop().call_soon(self._stamp)
        else:
            self._marks.append(now)

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
            if self._ended:
                await self.aclose()
                raise StopAsyncIteration
            if self._eof:
                if self._finished:  # finished, then ended without [DONE]: nothing is missing
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

    async def _fail(self, reason: str) -> None:
        if self._on_failure is not None:
            self._on_failure(reason)
        await self.aclose()

    def _feed(self, data: bytes) -> OutputEvent | None:
        """The event for one read: every complete frame in it (a partial one waits for the next read)."""
        if (
            self._client_streams
            and not self._buf
            and data.startswith(b"data: {")
            and data.endswith(b"}\n\n")
            and data.find(b"\n", 7) == len(data) - 2
        ):
            # The common read: one plain content chunk for a streaming client, forwarded as it came.
            before = self._output_tokens
            if self._fast(data[6:-2]):
                tokens = self._output_tokens - before
                if tokens:
                    now = time.monotonic()
                    self._mark(now)
                    if self.timing.first_token is None:
                        self.timing.first_token = now
                return OutputEvent("", tokens, self._prompt_tokens, self._output_tokens, wire_frames=data)
            self._tokens = 0  # the JSON path reads it again from the start
        return self._feed_frames(data)

    def _feed_frames(self, data: bytes) -> OutputEvent | None:
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:  # CRLF line ends (allowed by SSE); JSON strings never hold a raw CR
            buf = buf.replace(b"\r\n", b"\n")
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return None
        end += 2
        complete, self._buf = (buf, b"") if end == len(buf) else (buf[:end], buf[end:])
        frames = complete.split(b"\n\n")
        frames.pop()  # after the last separator
        self._tokens = 0
        self._finish = None
        self._stop_reason = None
        prompt_before, output_before = self._prompt_tokens, self._output_tokens
        pieces: list[bytes] = []
        verbatim = True
        for frame in frames:
            if frame[:6] == b"data: " and b"\n" not in frame:
                payload = frame[6:]
            else:
                verbatim = False
                data_lines = _data_of(frame)
                if data_lines is None:
                    continue  # blank lines, comments, event:/id: lines without data
                payload = data_lines
                frame = b"data: " + payload
            if payload == b"[DONE]":
                verbatim = False
                self._ended = True
                break  # the HTTP layer writes its own [DONE]
            kept: bool | bytes | None = self._fast(payload)
            if kept is None:
                kept = self._slow(payload)
            if kept is True:
                pieces.append(frame)
            elif kept is False:
                verbatim = False
            else:
                verbatim = False
                pieces.append(b"data: " + kept)
        wire: bytes | None = None
        if self._client_streams and pieces:
            wire = complete if verbatim else b"\n\n".join(pieces) + b"\n\n"
        tokens, finish = self._tokens, self._finish
        if (
            wire is None
            and not tokens
            and finish is None
            and prompt_before == self._prompt_tokens
            and output_before == self._output_tokens
        ):
            return None
        now = time.monotonic()
        if tokens or finish is not None:
            self._mark(now)
            if tokens and self.timing.first_token is None:
                self.timing.first_token = now
        if finish is not None:
            self._finished = True
            self.timing.finished = now
        text = ""
        if self._texts:
            text = "".join(self._texts)
            self._texts.clear()
        return OutputEvent(
            text,
            tokens,
            self._prompt_tokens,
            self._output_tokens,
            finish_reason=finish,
            stop_reason=self._stop_reason,
            wire_frames=wire,
        )

    def _add(self, text: str, nonempty: bool, completion: int | None) -> None:
        """Count a content chunk's tokens: from usage when given, else one per non-empty chunk."""
        if completion is None:
            new_tokens = 1 if nonempty else 0
        else:
            self._note_count(nonempty)
            new_tokens = max(0, completion - self._output_tokens)
        if nonempty:
            self._content_chunks += 1
        self._output_tokens += new_tokens
        self._tokens += new_tokens
        if text and not self._client_streams:
            self._texts.append(text)

    def _note_count(self, nonempty: bool) -> None:
        """A choice chunk carried ``usage.completion_tokens``: a running count when no content came before it
        without one (continuous usage stats), else a total on a late chunk (older llama.cpp's finish chunk,
        TGI's last completions chunk)."""
        if self._source is None:
            self._source = "usage" if self._content_chunks == 0 else "final_usage"

    def _fast(self, payload: bytes) -> bool | None:
        """Read a plain content chunk (most of a stream, the role chunk included) by byte search and keep it
        as it came (True); None for every other chunk (finishing, usage to strip, errors, usage-only, not
        compact), which the JSON path reads."""
        if (
            b'"choices":[{' not in payload
            or b'"error"' in payload
            or not payload.startswith(b"{")
            or not payload.endswith(b"}")
        ):
            return None
        f = payload.find(b'"finish_reason":')
        if f >= 0 and payload[f + 16 : f + 20] != b"null" and payload[f + 16 : f + 18] != b'""':
            return None  # TGI's completions chunks say "" until the last
        completion = None
        if b'"usage":{' in payload:
            if not self._keep_usage:
                return None  # usage to strip: the JSON path re-serialises the chunk
            counts = sse.usage_counts(payload)
            if counts is None:
                return None
            completion, prompt = counts
            if prompt is not None:
                self._prompt_tokens = prompt
        text = ""
        if self._client_streams:
            # sse.string_start, inlined: this runs once per forwarded chunk.
            j = payload.find(self._text_key)
            if j < 0:
                nonempty = False
            else:
                j += len(self._text_key)
                head = payload[j : j + 3]
                if head[:2] == b':"':
                    nonempty = head != b':""'
                elif head[:2] == b":n":
                    nonempty = False  # null
                else:
                    return None
        else:
            value = sse.string_value(payload, self._text_key)
            if not (value is None or isinstance(value, str)):
                return None
            text = value or ""
            nonempty = bool(text)
        if not nonempty and self._chat:
            # Reasoning models stream their thinking in another field (vLLM: reasoning_content, later
            # reasoning): tokens all the same, though not part of the assembled message.
            for key in (b'"reasoning_content"', b'"reasoning"'):
                mark = sse.string_start(payload, key)
                if mark is sse.NOT_COMPACT:
                    return None
                if mark is sse.NON_EMPTY:
                    nonempty = True
                    break
        if completion is None and not text:
            if nonempty:
                self._output_tokens += 1
                self._tokens += 1
                self._content_chunks += 1
        else:
            self._add(text, nonempty, completion)
        return True

    def _slow(self, payload: bytes) -> bool | bytes:
        """The JSON path: True to forward the frame as it came, False to drop it, bytes to forward instead."""
        try:
            chunk = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise upstream_error(self._upstream, f"upstream sent invalid JSON in the stream: {err}") from err
        if not isinstance(chunk, dict):
            return False
        if "error" in chunk and "choices" not in chunk:
            detail = chunk["error"]
            message = detail.get("message") if isinstance(detail, dict) else str(detail)
            raise upstream_error(self._upstream, f"upstream error mid-stream: {message}")
        usage = chunk.get("usage")
        completion: int | None = None
        if isinstance(usage, dict):
            prompt, used = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int):
                self._prompt_tokens = prompt
            if isinstance(used, int):
                completion = used
        choices = chunk.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else None
        if choice is None:
            # The usage-only chunk after the finishing one: exact totals; forwarded only if asked for.
            if completion is not None:
                self._output_tokens = max(self._output_tokens, completion)
                if self._source is None:
                    self._source = "final_usage"
            return self._keep_final_usage
        if self._chat:
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        else:
            text = choice.get("text") or ""
            reasoning = None
        text = text if isinstance(text, str) else ""
        self._add(text, bool(text or reasoning), completion)
        reason = choice.get("finish_reason")
        if reason:
            self._finish = _FINISH.get(reason, FinishReason.STOP)
            stop_reason = choice.get("stop_reason")
            self._stop_reason = stop_reason if isinstance(stop_reason, str) else None
        if isinstance(usage, dict) and not (self._keep_usage or self._keep_final_usage):
            # Usage the client asked no usage for: the proxy's own include_usage may have caused it. A client that
            # asked for usage gets it where the upstream puts it (older llama.cpp: on the finish chunk).
            chunk.pop("usage", None)
            return json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode()
        return True

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sink = None
        self._wake()  # a consumer waiting on a stream closed under it (abort, shutdown) ends
        if self._table is not None:
            self._table.pop(self.request_id, None)
        self.timing.lora_blocked_seconds += self._windows.blocked(self._marks)  # before finish_ok reads it
        if self._finished and self._on_token_source is not None:
            self._on_token_source(self._source or "chunks")
        # Closing (not releasing) the connection tells the upstream to abort the request, as a client
        # disconnect would; vLLM frees the slot and KV blocks on that.
        if not self._finished:
            self._response.close()
        else:
            self._response.release()


def _data_of(frame: bytes) -> bytes | None:
    """The data of one SSE event with several lines: its ``data:`` lines joined (SSE: one optional space after
    the colon), None when it has none."""
    parts = [line[5:].removeprefix(b" ") for line in frame.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(parts) if parts else None


FAILURE_REASONS = ("connect", "connection_closed", "timeout", "invalid_response", "stream_broken", "bad_stream")
"""Why the proxy failed a request itself (``loadlens_proxy_upstream_failures_total{reason}``, docs/metrics.md):

- ``connect``: no connection could be opened (refused, DNS, connect timeout): 503, the upstream is unreachable;
- ``connection_closed``: the upstream closed or reset the connection before answering, on a fresh connection
  (it may have received the request) or after the retries: 502;
- ``timeout``: no response within the read timeout: 504;
- ``invalid_response``: a response that is not HTTP: 502;
- ``stream_broken``: an accepted stream broke, stalled past the read timeout or was cut short: 502 as an SSE
  error event;
- ``bad_stream``: an accepted stream carried invalid JSON or an error event: 502 as an SSE error event.
"""

TOKEN_SOURCES = ("usage", "final_usage", "chunks")
"""Where a finished stream's output-token counts came from (``loadlens_proxy_token_counts_total{source}``):

- ``usage``: content chunks carried ``usage.completion_tokens`` (continuous usage stats): each output event's
  token count is the upstream's;
- ``final_usage``: one token per content chunk, the total corrected by the upstream's final usage (a
  ``choices: []`` chunk, or a total on a late chunk): the fallback, exact in total, per event assumed;
- ``chunks``: the upstream sent no usage at all: one token per content chunk, total included (an estimate).
"""

RETRY_REASONS = ("stale_connection", "connect")
"""Why a request was sent again (``loadlens_proxy_upstream_retries_total{reason}``); only requests that
provably never reached the upstream (:func:`retry_reason`)."""

CONNECT_RETRIES = 2
KEEPALIVE_S = 4.0
"""Idle pooled connections are closed after this, below the upstream's own keep-alive timeout (uvicorn's and
so vLLM's default is 5 s): the proxy, not the upstream, closes idle connections, which keeps the race of a
request sent on a connection the upstream is closing rare; :func:`retry_reason` covers the rest."""


def retry_reason(err: BaseException, reused: bool) -> str | None:
    """The reason to send a failed request again, or None when it may have reached the upstream.

    Provably unsent, from aiohttp's client (``ClientSession._request``, ``ClientRequest.write_bytes``,
    ``ResponseHandler.connection_lost``):

    - ``connect``: ``ClientConnectorError`` / ``ConnectionTimeoutError`` are raised by
      ``connector.connect()``, before ``req.send()`` wrote a byte.
    - ``stale_connection``: a *reused* keep-alive connection was closed (``ServerDisconnectedError`` without a
      partial response) or reset (``ClientOSError`` with ``EPIPE``/``ECONNRESET``, among them "Can not write
      request body") before any response byte. An HTTP/1.1 server closes a persistent connection without
      answering only when it is idle: it closed it before our request reached it (RFC 9112 section 9.3.1; the
      race its keep-alive timer loses). A fresh connection closed the same way may have delivered the request
      to a server that then failed: not retried.

    The streaming client (``upstream_http``, :meth:`OpenAIProxyEngine._open_stream`) types the same cases:
    ``ConnectFailed`` (connect), ``ClosedBeforeAnswer`` on a reused connection without a byte of answer
    (``partial`` false: stale_connection).

    Every exception :meth:`OpenAIProxyEngine._send` sees comes from ``session.post``, i.e. before the status
    line was parsed; nothing after response start is ever retried. (The one case this cannot tell apart: a
    server that read the request on a reused connection and then died without a byte of answer; it is
    retried, as browsers and HTTP client libraries retry it.)
    """
    if isinstance(err, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, upstream_http.ConnectFailed)):
        return "connect"
    if not reused:
        return None
    if isinstance(err, upstream_http.ClosedBeforeAnswer):
        return None if err.partial else "stale_connection"
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return "stale_connection" if isinstance(err.message, str) else None  # else: a partial response
    if isinstance(err, aiohttp.ClientOSError) and (
        err.errno in (errno.EPIPE, errno.ECONNRESET)
        or isinstance(err.__cause__, (ConnectionResetError, BrokenPipeError))
    ):
        return "stale_connection"  # "Can not write request body" carries the reset as its cause, errno None
    return None


def failure_reason(err: BaseException) -> str:
    """The ``FAILURE_REASONS`` entry for an exception from ``session.post`` or the streaming pool (no response
    yet)."""
    if isinstance(err, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, upstream_http.ConnectFailed)):
        return "connect"
    if isinstance(err, upstream_http.InvalidResponse):
        return "invalid_response"
    if isinstance(err, TimeoutError):  # aiohttp's ServerTimeoutError (sock_read) is one
        return "timeout"
    if isinstance(err, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, OSError)):
        return "connection_closed"
    if isinstance(err, upstream_http.UpstreamHTTPError):  # closed before answering, or mid-body
        return "connection_closed"
    return "invalid_response"


def _send_failure(upstream: str, reason: str, err: BaseException) -> EngineError:
    if reason == "connect":
        return upstream_error(upstream, err)
    status = 504 if reason == "timeout" else 502
    what = {"timeout": "did not answer in time", "invalid_response": "sent an invalid response"}.get(
        reason, "closed the connection without answering"
    )
    return EngineError(ErrorKind.UPSTREAM, f"upstream {upstream} {what}: {err or type(err).__name__}", status=status)


class ProxyMetrics:
    """The proxy's own series: failures it answers for and the retries it made (docs/metrics.md)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter(
            "loadlens_proxy_upstream_failures",
            "Requests the proxy failed itself because the upstream could not be used, by reason.",
            ["reason"],
            registry=registry,
        )
        self.retries = Counter(
            "loadlens_proxy_upstream_retries",
            "Requests sent again because the first try provably never reached the upstream, by reason.",
            ["reason"],
            registry=registry,
        )
        self.token_counts = Counter(
            "loadlens_proxy_token_counts",
            "Finished streams by where their output-token counts came from (usage, final_usage, chunks).",
            ["source"],
            registry=registry,
        )
        self.upstream_info = Gauge(
            "loadlens_proxy_upstream_info",
            "1 for the kind of upstream the proxy drives (--upstream-kind, or detected by auto).",
            ["upstream_kind"],
            registry=registry,
        )
        self._failures = {reason: self.failures.labels(reason) for reason in FAILURE_REASONS}
        self._retries = {reason: self.retries.labels(reason) for reason in RETRY_REASONS}
        self._token_counts = {source: self.token_counts.labels(source) for source in TOKEN_SOURCES}
        self.upstream_info.labels(upstream_kinds.UNKNOWN).set(1)

    def failure(self, reason: str) -> None:
        self._failures[reason].inc()

    def retry(self, reason: str) -> None:
        self._retries[reason].inc()

    def token_source(self, source: str) -> None:
        self._token_counts[source].inc()

    def set_kind(self, kind: str) -> None:
        """One series at 1: the kind in use (``unknown`` until ``auto`` has seen the upstream)."""
        self.upstream_info.clear()
        self.upstream_info.labels(kind).set(1)


class _Attempt:
    """Per-try trace context: whether aiohttp handed this try a pooled (reused) connection."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


async def _on_reuse(_session: aiohttp.ClientSession, ctx: Any, _params: Any) -> None:
    if isinstance(ctx.trace_request_ctx, _Attempt):
        ctx.trace_request_ctx.reused = True


class OpenAIProxyEngine(Engine):
    """Forwards to ``upstream`` (e.g. ``http://127.0.0.1:8001``) over one bounded pool of keep-alive
    connections (``max_connections``; 0 = unbounded). Requests beyond the pool wait for a free connection.
    ``upstream_kind`` (``auto`` or one of ``upstream_kinds.KINDS``) picks its adapter endpoints and context
    length source; ``auto`` detects it from the upstream's own answers (:meth:`_detect`)."""

    name = "openai"
    _pool: ConnectionPool | None = None

    def __init__(
        self,
        upstream: str,
        *,
        api_key: str | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
        max_connections: int = 1024,
        swap_windows: SwapWindows | None = None,
        registry: CollectorRegistry | None = None,
        upstream_kind: str = "auto",
    ) -> None:
        if upstream_kind != "auto" and upstream_kind not in upstream_kinds.KINDS:
            raise ValueError(
                f"upstream_kind must be auto or one of {', '.join(upstream_kinds.KINDS)}, got {upstream_kind!r}"
            )
        if not upstream.startswith(("http://", "https://")):
            raise ValueError(f"upstream must be an http(s) URL, got {upstream!r}")
        if max_connections < 0:
            raise ValueError(f"max_connections must be >= 0, got {max_connections}")
        self.upstream = upstream.rstrip("/")
        if self.upstream.endswith("/v1"):
            self.upstream = self.upstream[:-3]
        self._api_key = api_key
        # The wait for a pooled connection is not bounded (the upstream's own queue would hold the request
        # otherwise); opening one is (sock_connect), and so is each wait for upstream bytes (sock_read).
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        self._streams: dict[str, _ProxyStream] = {}
        self._cards: list[ModelCard] = []
        self.swap_windows = swap_windows if swap_windows is not None else SwapWindows()  # load/unload calls, timed
        self.metrics = ProxyMetrics(registry if registry is not None else CollectorRegistry())
        self.configured_kind = upstream_kind
        self.kind: str | None = None if upstream_kind == "auto" else upstream_kind
        self.kind_evidence = "" if self.kind is None else "--upstream-kind"
        self.context_length: int | None = None  # from the kind's source, once read
        self._context_read = False
        if self.kind is not None:
            self.metrics.set_kind(self.kind)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=KEEPALIVE_S
        )
        tracing = aiohttp.TraceConfig()
        tracing.on_connection_reuseconn.append(_on_reuse)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            read_bufsize=2**16,
            trace_configs=[tracing],
        )
        # Retries after a stale pooled connection: each on a new connection, closed after its response.
        self._fresh = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections, force_close=True),
            timeout=self._timeout,
            auto_decompress=False,
            read_bufsize=2**16,
        )
        # Generation requests, streamed: their own pool on bare protocols (upstream_http), cheap per chunk.
        url = urlsplit(self.upstream)
        https = url.scheme == "https"
        self._pool = ConnectionPool(
            url.hostname or "",
            url.port or (443 if https else 80),
            limit=self.max_connections,
            connect_timeout_s=float(self._timeout.sock_connect or 0) or 5.0,
            read_timeout_s=float(self._timeout.sock_read or 0) or 600.0,
            keepalive_s=KEEPALIVE_S,
            ssl=upstream_http.client_tls() if https else None,
        )
        with contextlib.suppress(EngineError):
            self._cards = await self._fetch_models()

    async def stop(self) -> None:
        for stream in list(self._streams.values()):
            await stream.aclose()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        if extra:
            headers.update({k: v for k, v in extra.items() if k.lower() not in _DROP_HEADERS})
        return headers

    async def _open_stream(self, path: str, body: bytes, headers: Mapping[str, str]) -> upstream_http.Response:
        """POST a generation request on the streaming pool and wait for the response head, with
        :meth:`_send`'s retries: after a stale pooled connection, once, on a new connection; after a failed
        connect, up to ``CONNECT_RETRIES`` times. Failures raise EngineError, counted by reason."""
        pool = self._pool
        if pool is None:
            raise EngineError(ErrorKind.UNAVAILABLE, "proxy engine is not started")
        url = urlsplit(self.upstream)
        raw = upstream_http.request_bytes("POST", url.path.rstrip("/") + path, url.netloc, dict(headers), body)
        connect_retries = 0
        fresh = False
        while True:
            try:
                return await pool.request(raw, fresh=fresh)
            except upstream_http.UpstreamHTTPError as err:
                retry = retry_reason(err, err.reused)
                if retry == "connect" and connect_retries < CONNECT_RETRIES:
                    connect_retries += 1
                    self.metrics.retry(retry)
                    await asyncio.sleep(0.05 * connect_retries)  # a listen backlog that overflowed drains
                    continue
                if retry == "stale_connection" and not fresh:
                    self.metrics.retry(retry)
                    fresh = True
                    continue
                reason = failure_reason(err)
                self.metrics.failure(reason)
                raise _send_failure(self.upstream, reason, err) from err

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise EngineError(ErrorKind.UNAVAILABLE, "proxy engine is not started")
        return self._session

    async def _send(self, path: str, body: bytes, headers: Mapping[str, str]) -> aiohttp.ClientResponse:
        """POST and wait for the response head. A try that provably never reached the upstream
        (:func:`retry_reason`) is sent again: after a stale pooled connection, once, on a fresh connection
        (``_fresh``: the pool may hold more connections the upstream is closing); after a failed connect, up to
        ``CONNECT_RETRIES`` times. Failures raise EngineError, counted by reason."""
        session = self._require_session()
        url = self.upstream + path
        connect_retries = 0
        while True:
            ctx = _Attempt()
            try:
                return await session.post(url, data=body, headers=headers, trace_request_ctx=ctx)
            except _UNREACHABLE as err:
                retry = retry_reason(err, ctx.reused)
                if retry == "connect" and connect_retries < CONNECT_RETRIES:
                    connect_retries += 1
                    self.metrics.retry(retry)
                    await asyncio.sleep(0.05 * connect_retries)  # a listen backlog that overflowed drains
                    continue
                if retry == "stale_connection" and self._fresh is not None:
                    self.metrics.retry(retry)
                    session = self._fresh
                    continue
                reason = failure_reason(err)
                self.metrics.failure(reason)
                raise _send_failure(self.upstream, reason, err) from err

    async def generate(self, request: GenerationRequest) -> RequestStream:
        body = dict(request.body)
        body["stream"] = True
        options = dict(body.get("stream_options") or {})
        # Always ask for the final usage chunk so token totals are exact (it is forwarded only to clients that
        # asked). Per-chunk usage is requested only when the client asked for it: stripping it again would
        # cost a JSON re-serialisation per token; without it each content chunk counts one token (exact for
        # vLLM without speculative decoding) and the final usage corrects the total.
        options["include_usage"] = True
        body["stream_options"] = options
        response = await self._open_stream(
            _PATHS[request.endpoint], json.dumps(body).encode(), self._headers(request.trace_headers)
        )
        if response.status != 200:
            try:
                raw = await response.read()
            except _UNREACHABLE:
                raw = b""  # the status arrived, its body did not: still the upstream's answer, not ours to 500
            response.release()
            raise upstream_error(
                self.upstream, response.status, raw=raw, retry_after=response.headers.get("retry-after")
            )
        stream = _ProxyStream(
            response,
            request,
            self.upstream,
            self.swap_windows,
            self.metrics.failure,
            self._streams,
            self.metrics.token_source,
        )
        self._streams[request.request_id] = stream
        stream.timing.queued = time.monotonic()
        response.consume(stream.on_data, stream.on_end)
        return stream

    async def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            await stream.aclose()

    async def _get(self, path: str) -> tuple[int, bytes]:
        """GET ``path``: (status, body). Raises EngineError (503) when the upstream is unreachable."""
        session = self._require_session()
        try:
            async with session.get(self.upstream + path, headers=self._headers()) as response:
                return response.status, await response.read()
        except _UNREACHABLE as err:
            raise upstream_error(self.upstream, err) from err

    async def _get_json(self, path: str) -> tuple[int, Mapping[str, Any] | None]:
        """GET ``path``: (status, its JSON object or None)."""
        status, raw = await self._get(path)
        return status, _error_body(raw)

    async def _fetch_models(self) -> list[ModelCard]:
        status, raw = await self._get("/v1/models")
        if status != 200:
            # Never reaches a client (models() and start() fall back to the cached cards).
            if self.kind is None:
                await self._settle_kind("openai", f"/v1/models answered {status}")
            raise upstream_error(self.upstream, status, raw=raw)
        doc = _error_body(raw) or {}
        await self._detect(doc)
        cards = []
        for item in doc.get("data") or []:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                mml = item.get("max_model_len")
                if not isinstance(mml, int):
                    mml = self.context_length  # llama.cpp, TGI, older sglang: from the kind's own source
                cards.append(
                    ModelCard(
                        id=item["id"],
                        owned_by=str(item.get("owned_by") or "upstream"),
                        max_model_len=mml if isinstance(mml, int) else None,
                        parent=item.get("parent") if isinstance(item.get("parent"), str) else None,
                        root=item.get("root") if isinstance(item.get("root"), str) else None,
                    )
                )
        return cards

    async def models(self) -> list[ModelCard]:
        with contextlib.suppress(EngineError):
            self._cards = await self._fetch_models()
        return list(self._cards)

    def max_model_len(self) -> int | None:
        return self.context_length

    async def _detect(self, models: Mapping[str, Any]) -> None:
        """Settle the kind (``auto``) from a 200 ``/v1/models`` answer, then read the context length from the
        kind's source, each once. ``auto``: the cards' ``owned_by`` (vllm, sglang, llamacpp; loadlens is
        driven as vLLM); a card owned by itself with ``created`` 0 is TGI's if ``/info`` names TGI's router;
        anything else is ``openai``, with no further requests."""
        info: Mapping[str, Any] | None = None
        if self.kind is None:
            kind = upstream_kinds.kind_from_models(models)
            evidence = f"/v1/models owned_by {kind}"
            if kind is None and upstream_kinds.may_be_tgi(models):
                status, info = await self._get_json("/info")
                if status == 200 and upstream_kinds.is_tgi_info(info):
                    kind, evidence = "tgi", "/info router text-generation-router"
            if kind is None:
                kind, evidence = "openai", "no known server in /v1/models"
            await self._settle_kind(kind, evidence)
        if self._context_read:
            return
        self._context_read = True
        context = upstream_kinds.context_from_models(models)
        with contextlib.suppress(EngineError):  # the context length is a nicety: never fail a call for it
            if context is None and self.kind == "llamacpp":
                status, props = await self._get_json("/props")
                context = upstream_kinds.context_from_llamacpp_props(props) if status == 200 else None
            elif context is None and self.kind == "tgi":
                if info is None:
                    status, info = await self._get_json("/info")
                context = upstream_kinds.context_from_tgi_info(info)
            elif context is None and self.kind == "sglang":
                status, server = await self._get_json("/get_server_info")
                context = upstream_kinds.context_from_sglang_server_info(server) if status == 200 else None
        self.context_length = context

    async def _settle_kind(self, kind: str, evidence: str) -> None:
        self.kind, self.kind_evidence = kind, evidence
        self.metrics.set_kind(kind)
        _log.info("upstream %s is %s (%s)", self.upstream, kind, evidence)

    async def _dialect(self) -> upstream_kinds.Dialect:
        """The upstream's dialect; an ``auto`` kind not yet seen is detected now (503 while unreachable)."""
        if self.kind is None:
            self._cards = await self._fetch_models()
        assert self.kind is not None
        return upstream_kinds.DIALECTS[self.kind]

    def _no_swaps(self, dialect: upstream_kinds.Dialect) -> EngineError:
        return EngineError(
            ErrorKind.UPSTREAM,
            f"the {dialect.kind} upstream cannot load or unload LoRA adapters at runtime: {dialect.no_swap_reason}",
            status=501,
        )

    async def _post_admin(self, path: str, body: Mapping[str, Any]) -> None:
        response = await self._send(path, json.dumps(body).encode(), self._headers())
        try:
            raw = await response.read()
        except _UNREACHABLE as err:
            raise upstream_error(self.upstream, err) from err
        finally:
            response.release()
        if response.status != 200:
            raise upstream_error(self.upstream, response.status, raw=raw)

    async def load_adapter(self, lora: LoRARequest) -> None:
        dialect = await self._dialect()
        if dialect.load_path is None:
            raise self._no_swaps(dialect)
        body = {"lora_name": lora.lora_name, "lora_path": lora.lora_path}  # vLLM's and sglang's shape alike
        await self.swap_windows.timed(lora.lora_name, "load", self._post_admin(dialect.load_path, body))

    async def unload_adapter(self, lora_name: str) -> None:
        dialect = await self._dialect()
        if dialect.unload_path is None:
            raise self._no_swaps(dialect)
        call = self._post_admin(dialect.unload_path, {"lora_name": lora_name})
        await self.swap_windows.timed(lora_name, "unload", call)

    def knobs(self) -> dict[str, Any]:
        return {"upstream": self.upstream, "upstream_kind": self.kind or upstream_kinds.UNKNOWN}

    async def set_knobs(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        raise EngineError(
            ErrorKind.INVALID_REQUEST,
            f"the openai proxy engine has no runtime knobs (got {', '.join(sorted(changes))}); "
            "change the upstream server's own settings",
            param=next(iter(changes), None),
        )

    async def health(self) -> Health:
        session = self._session
        if session is None:
            return Health(False, "not started")
        try:
            async with session.get(self.upstream + "/health", timeout=aiohttp.ClientTimeout(total=5)) as response:
                if response.status == 200:
                    return Health(True)
                return Health(False, f"upstream /health returned {response.status}")
        except _UNREACHABLE as err:
            return Health(False, f"upstream unreachable: {err}")
