"""The ``openai`` engine: a transparent proxy to any OpenAI-compatible upstream (vllm serve, sglang,
llama.cpp server, another loadlens).

- Streams chunk by chunk without buffering: each upstream SSE ``data:`` payload is forwarded verbatim as the
  event's ``wire_chunk``. The proxy always asks for the final usage chunk (exact token totals) and forwards it
  only to clients that asked for it.
- Non-streaming client requests are streamed from the upstream too, so the proxy measures time to first token
  for them as well; the HTTP layer assembles the JSON body.
- Upstream errors keep their status and body; an unreachable upstream is 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

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
from exporters.serving.swap_windows import SwapWindows, progress_marks
from loadlens.util import sse

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_FINISH = {r.value: r for r in FinishReason}
# Headers the proxy must not forward: hop-by-hop ones, and the body-describing ones aiohttp recomputes.
_DROP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "accept-encoding"}


def _error_body(raw: bytes) -> Mapping[str, Any] | None:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


# What aiohttp raises when the upstream cannot be reached or stops answering (refused, DNS, timeouts).
_UNREACHABLE = (aiohttp.ClientError, TimeoutError, OSError)


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
        if isinstance(body.get("message"), str):
            return str(body["message"])
    text = raw[:200].decode("utf-8", "replace").strip()
    return f"upstream returned HTTP {status}" + (f": {text}" if text else "")


class _ProxyStream(RequestStream):
    def __init__(
        self,
        response: aiohttp.ClientResponse,
        request: GenerationRequest,
        upstream: str,
        windows: SwapWindows | None = None,
    ) -> None:
        self.request_id = request.request_id
        self._upstream = upstream
        self.timing = RequestTiming()
        self._response = response
        self._endpoint = request.endpoint
        self._keep_usage = bool((request.body.get("stream_options") or {}).get("continuous_usage_stats"))
        self._keep_final_usage = bool((request.body.get("stream_options") or {}).get("include_usage"))
        self._client_streams = request.stream_requested
        self._prompt_tokens = 0
        self._output_tokens = 0
        self._finished = False
        self._closed = False
        self._lines = response.content.__aiter__()
        self._windows = windows if windows is not None else SwapWindows()
        self._marks = progress_marks(request.arrival_time)  # admission, then each token chunk's arrival

    async def __anext__(self) -> OutputEvent:
        while True:
            try:
                line = await self._lines.__anext__()
            except StopAsyncIteration:
                await self.aclose()
                if not self._finished:
                    self.timing.finished = asyncio.get_running_loop().time()
                    raise upstream_error(self._upstream, "upstream closed the stream before finishing") from None
                raise
            except aiohttp.ClientError as err:
                await self.aclose()
                raise upstream_error(self._upstream, f"upstream stream broke: {err}") from err
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event: lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                await self.aclose()
                raise StopAsyncIteration
            event = self._parse(payload)
            if event is not None:
                if event.new_tokens or event.finish_reason is not None:
                    self._marks.append(time.monotonic())
                return event

    def _parse(self, payload: bytes) -> OutputEvent | None:
        fields = self._fast_fields(payload)
        if fields is not None:
            text, completion, prompt = fields
            if prompt is not None:
                self._prompt_tokens = prompt
            new_tokens = self._count(text, completion)
            forwarded = payload if self._client_streams else None
            return OutputEvent(text, new_tokens, self._prompt_tokens, self._output_tokens, wire_chunk=forwarded)
        try:
            chunk = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise upstream_error(self._upstream, f"upstream sent invalid JSON in the stream: {err}") from err
        if not isinstance(chunk, dict):
            return None
        if "error" in chunk and "choices" not in chunk:
            detail = chunk["error"]
            message = detail.get("message") if isinstance(detail, dict) else str(detail)
            raise upstream_error(self._upstream, f"upstream error mid-stream: {message}")
        usage = chunk.get("usage")
        new_tokens_from_usage: int | None = None
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int):
                self._prompt_tokens = prompt
            if isinstance(completion, int):
                new_tokens_from_usage = max(0, completion - self._output_tokens)
        choices = chunk.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else None
        if choice is None:
            # The usage-only chunk after the finishing one.
            if new_tokens_from_usage:
                self._output_tokens += new_tokens_from_usage
            usage_wire = payload if (self._keep_final_usage and self._client_streams) else None
            if usage_wire is None and not self._finished:
                return None
            return OutputEvent("", 0, self._prompt_tokens, self._output_tokens, wire_chunk=usage_wire)
        if self._endpoint == "chat":
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            role = delta.get("role")
        else:
            text = choice.get("text") or ""
            role = None
        completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
        new_tokens = self._count(text, completion if isinstance(completion, int) else None)
        reason = choice.get("finish_reason")
        finish = _FINISH.get(reason, FinishReason.STOP) if reason else None
        if finish is not None:
            self._finished = True
            self.timing.finished = asyncio.get_running_loop().time()
        wire: bytes | None = None
        if self._client_streams:
            if isinstance(usage, dict) and not self._keep_usage:
                chunk.pop("usage", None)
                wire = json.dumps(chunk, separators=(",", ":")).encode()
            else:
                wire = payload
        stop_reason = choice.get("stop_reason")
        return OutputEvent(
            text=text,
            new_tokens=new_tokens,
            prompt_tokens=self._prompt_tokens,
            output_tokens=self._output_tokens,
            finish_reason=finish,
            stop_reason=stop_reason if isinstance(stop_reason, str) else None,
            wire_chunk=wire,
            role=role if isinstance(role, str) and not text else None,
        )

    def _fast_fields(self, payload: bytes) -> tuple[str, int | None, int | None] | None:
        """(text, completion_tokens, prompt_tokens) of a plain content chunk, read without json.loads; None
        for every other chunk (role, finish, usage to strip, errors, anything not compact), which the JSON
        path handles. Most chunks of a stream are plain content chunks, forwarded as they are."""
        if payload[:1] != b"{" or payload[-1:] != b"}" or b'"error"' in payload or b'"choices":[{' not in payload:
            return None
        for key in (b'"finish_reason"', b'"stop_reason"', b'"role"'):
            if not sse.is_null_or_absent(payload, key):
                return None
        no_usage = sse.is_null_or_absent(payload, b'"usage"')
        completion = prompt = None
        if no_usage is None:
            return None
        if not no_usage:
            # Usage the client did not ask for is stripped by re-serialising: the JSON path does that.
            if not self._keep_usage or b'"usage":{' not in payload:
                return None
            counts = sse.usage_counts(payload)
            if counts is None:
                return None
            completion, prompt = counts
        if self._endpoint == "chat" and b'"delta":{' not in payload:
            return None
        text = sse.string_value(payload, b'"content"' if self._endpoint == "chat" else b'"text"')
        if not (text is None or isinstance(text, str)):
            return None
        return text or "", completion, prompt

    def _count(self, text: str, completion: int | None) -> int:
        """Output tokens a content chunk carries: from usage when given, else one per non-empty chunk."""
        if completion is None:
            new_tokens = 1 if text else 0
        else:
            new_tokens = max(0, completion - self._output_tokens)
        self._output_tokens += new_tokens
        if new_tokens and self.timing.first_token is None:
            self.timing.first_token = asyncio.get_running_loop().time()
        return new_tokens

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.timing.lora_blocked_seconds += self._windows.blocked(self._marks)  # before finish_ok reads it
        # Closing (not releasing) the connection tells the upstream to abort the request, as a client
        # disconnect would; vLLM frees the slot and KV blocks on that.
        if not self._finished:
            self._response.close()
        else:
            self._response.release()


class OpenAIProxyEngine(Engine):
    """Forwards to ``upstream`` (e.g. ``http://127.0.0.1:8001``). One pooled keep-alive session."""

    name = "openai"

    def __init__(
        self,
        upstream: str,
        *,
        api_key: str | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
        max_connections: int = 0,
        swap_windows: SwapWindows | None = None,
    ) -> None:
        if not upstream.startswith(("http://", "https://")):
            raise ValueError(f"upstream must be an http(s) URL, got {upstream!r}")
        self.upstream = upstream.rstrip("/")
        if self.upstream.endswith("/v1"):
            self.upstream = self.upstream[:-3]
        self._api_key = api_key
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._streams: dict[str, _ProxyStream] = {}
        self._cards: list[ModelCard] = []
        self.swap_windows = swap_windows if swap_windows is not None else SwapWindows()  # load/unload calls, timed

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max_connections, ttl_dns_cache=300, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False, read_bufsize=2**16
        )
        with contextlib.suppress(EngineError):
            self._cards = await self._fetch_models()

    async def stop(self) -> None:
        for stream in list(self._streams.values()):
            await stream.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        if extra:
            headers.update({k: v for k, v in extra.items() if k.lower() not in _DROP_HEADERS})
        return headers

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise EngineError(ErrorKind.UNAVAILABLE, "proxy engine is not started")
        return self._session

    async def generate(self, request: GenerationRequest) -> RequestStream:
        session = self._require_session()
        body = dict(request.body)
        body["stream"] = True
        options = dict(body.get("stream_options") or {})
        # Always ask for the final usage chunk so token totals are exact (it is forwarded only to clients that
        # asked). Per-chunk usage is requested only when the client asked for it: stripping it again would
        # cost a JSON re-serialisation per token; without it each content chunk counts one token (exact for
        # vLLM without speculative decoding) and the final usage corrects the total.
        options["include_usage"] = True
        body["stream_options"] = options
        try:
            response = await session.post(
                self.upstream + _PATHS[request.endpoint],
                data=json.dumps(body).encode(),
                headers=self._headers(request.trace_headers),
            )
        except _UNREACHABLE as err:
            raise upstream_error(self.upstream, err) from err
        if response.status != 200:
            try:
                raw = await response.read()
            except _UNREACHABLE:
                raw = b""  # the status arrived, its body did not: still the upstream's answer, not ours to 500
            response.release()
            raise upstream_error(
                self.upstream, response.status, raw=raw, retry_after=response.headers.get("retry-after")
            )
        stream = _ProxyStream(response, request, self.upstream, self.swap_windows)
        self._streams[request.request_id] = stream
        stream.timing.queued = asyncio.get_running_loop().time()
        return _Tracked(stream, self._streams)

    async def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            await stream.aclose()

    async def _fetch_models(self) -> list[ModelCard]:
        session = self._require_session()
        try:
            async with session.get(self.upstream + "/v1/models", headers=self._headers()) as response:
                raw = await response.read()
                if response.status != 200:
                    # Never reaches a client (models() and start() fall back to the cached cards).
                    raise upstream_error(self.upstream, response.status, raw=raw)
        except _UNREACHABLE as err:
            raise upstream_error(self.upstream, err) from err
        doc = _error_body(raw) or {}
        cards = []
        for item in doc.get("data") or []:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                mml = item.get("max_model_len")
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

    async def _post_admin(self, path: str, body: Mapping[str, Any]) -> None:
        session = self._require_session()
        try:
            async with session.post(
                self.upstream + path, data=json.dumps(body).encode(), headers=self._headers()
            ) as response:
                raw = await response.read()
                if response.status != 200:
                    raise upstream_error(self.upstream, response.status, raw=raw)
        except _UNREACHABLE as err:
            raise upstream_error(self.upstream, err) from err

    async def load_adapter(self, lora: LoRARequest) -> None:
        body = {"lora_name": lora.lora_name, "lora_path": lora.lora_path}
        await self.swap_windows.timed(lora.lora_name, "load", self._post_admin("/v1/load_lora_adapter", body))

    async def unload_adapter(self, lora_name: str) -> None:
        call = self._post_admin("/v1/unload_lora_adapter", {"lora_name": lora_name})
        await self.swap_windows.timed(lora_name, "unload", call)

    def knobs(self) -> dict[str, Any]:
        return {"upstream": self.upstream}

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


class _Tracked(RequestStream):
    """Removes the stream from the engine's table when it ends, however it ends."""

    def __init__(self, inner: _ProxyStream, table: dict[str, _ProxyStream]) -> None:
        self._inner = inner
        self._table = table
        self.request_id = inner.request_id
        self.timing = inner.timing

    async def __anext__(self) -> OutputEvent:
        try:
            return await self._inner.__anext__()
        except BaseException:
            self._table.pop(self.request_id, None)
            raise

    async def aclose(self) -> None:
        self._table.pop(self.request_id, None)
        await self._inner.aclose()
