"""The ``openai`` engine: a transparent proxy to any OpenAI-compatible upstream (vllm serve, sglang,
llama.cpp server, text-generation-inference, another loadlens).

- Streams without buffering and without re-encoding: each read of the upstream connection becomes one event
  whose ``wire_frames`` are the upstream's SSE frames as they came (several when the proxy fell behind: one
  write). Token counts, finish reason and usage are read from the bytes; ``json.loads`` only for the few
  chunks that need it (``frames.py``; delivery in ``stream.py``). The proxy always asks for the final usage
  chunk (exact token totals) and forwards it only to clients that asked for it.
- Generation requests go over ``upstream_pool`` (keep-alive connections on bare asyncio protocols): each read
  is turned into its event inside the socket callback and handed to the HTTP layer there
  (``RequestStream.deliver_to``), which writes it to the client without waking a task. Model lists, health and
  adapter calls use aiohttp.
- A non-streaming client's request is sent on as it came, non-streamed, and the upstream's answer relayed
  whole, byte for byte (``whole.py``): the client gets the upstream's own body. Its token counts and finish
  reason are read from that body; it has no time to first token (the tokens arrive at once).
- The upstream's kind (``--upstream-kind``, detected with ``auto``; ``upstream_kinds.py``) decides which
  adapter endpoints it has (or that it has none: 501) and where its context length comes from.
- Upstream errors keep their status and body, byte for byte. The proxy answers for itself only when the
  upstream could not be used: 503 unreachable, 502 closed without answering / broken stream, 504 no answer in
  time, each counted by reason (``errors.py``, ``metrics.py``); a try that provably never reached the upstream
  (a stale keep-alive connection) is sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from prometheus_client import CollectorRegistry

from exporters.serving.engine import (
    Engine,
    EngineError,
    ErrorKind,
    GenerationRequest,
    Health,
    LoRARequest,
    ModelCard,
    RequestStream,
    RequestTiming,
)
from exporters.serving.engines.openai import upstream_http, upstream_kinds
from exporters.serving.engines.openai.errors import (
    UNREACHABLE,
    failure_reason,
    json_object,
    retry_reason,
    send_failure,
    upstream_error,
)
from exporters.serving.engines.openai.metrics import ProxyMetrics
from exporters.serving.engines.openai.mfu import ProxyMfu
from exporters.serving.engines.openai.stream import ProxyStream
from exporters.serving.engines.openai.swap_windows import SwapWindows
from exporters.serving.engines.openai.upstream_pool import ConnectionPool
from exporters.serving.engines.openai.whole import WholeAnswer, whole_event
from loadlens.contracts import mfu

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_log = logging.getLogger("loadlens.serve")
# Headers the proxy must not forward: hop-by-hop ones, and the body-describing ones aiohttp recomputes.
_DROP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "accept-encoding"}

CONNECT_RETRIES = 2
KEEPALIVE_S = 4.0
"""Idle pooled connections are closed after this, below the upstream's own keep-alive timeout (uvicorn's and
so vLLM's default is 5 s): the proxy, not the upstream, closes idle connections, which keeps the race of a
request sent on a connection the upstream is closing rare; :func:`retry_reason` covers the rest."""


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
    supports_responses_api = False  # chat and completions are forwarded verbatim; nothing translates /v1/responses
    forwards_upstream_errors = True  # the upstream's own status and error body reach the client unchanged
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
        mfu_shape: mfu.Shape | None = None,
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
        self._streams: dict[str, ProxyStream] = {}
        self._cards: list[ModelCard] = []
        self.swap_windows = swap_windows if swap_windows is not None else SwapWindows()  # load/unload calls, timed
        self.metrics = ProxyMetrics(registry if registry is not None else CollectorRegistry())
        # --enable-mfu-metrics with --model-config: vLLM's estimated FLOPs/bytes counters from token counts.
        self.mfu = ProxyMfu(mfu_shape, self.metrics.registry) if mfu_shape is not None else None
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
                raise send_failure(self.upstream, reason, err) from err

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
            except UNREACHABLE as err:
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
                raise send_failure(self.upstream, reason, err) from err

    async def generate(self, request: GenerationRequest) -> RequestStream:
        if self.mfu is None:
            return await self._generate(request)
        # vLLM's model_name label: the base model an adapter serves (its parent in /v1/models).
        name = next((c.parent for c in self._cards if c.id == request.model and c.parent), request.model)
        return await self.mfu.track(name, self._generate(request))

    async def _generate(self, request: GenerationRequest) -> RequestStream:
        if not request.stream_requested:
            return await self._generate_whole(request)
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
            raise await self._refusal(response)
        stream = ProxyStream(
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

    async def _generate_whole(self, request: GenerationRequest) -> RequestStream:
        """A client that does not stream: its request goes on as it came (non-streamed) and the upstream's
        answer comes back whole, its bytes relayed unchanged (``whole.py``). The upstream answers only when
        it has finished, so this returns then; cancelled before (the client went away), the connection is
        closed, which the upstream takes as the client leaving (vLLM aborts the request)."""
        timing = RequestTiming()
        response = await self._open_stream(
            _PATHS[request.endpoint], json.dumps(request.body).encode(), self._headers(request.trace_headers)
        )
        if response.status != 200:
            raise await self._refusal(response)
        try:
            raw = await response.read()
        except UNREACHABLE as err:
            response.close()
            self.metrics.failure("stream_broken")
            raise upstream_error(self.upstream, f"upstream answer broke: {err}") from err
        except BaseException:
            response.close()
            raise
        response.release()
        timing.finished = time.monotonic()
        event, counted = whole_event(raw, response.headers.get("content-type"))
        if counted:
            self.metrics.token_source("usage")
        return WholeAnswer(request.request_id, event, timing)

    async def _refusal(self, response: upstream_http.Response) -> EngineError:
        """The upstream's non-200 answer to a generation request, its body read and forwarded as it came."""
        try:
            raw = await response.read()
        except UNREACHABLE:
            raw = b""  # the status arrived, its body did not: still the upstream's answer, not ours to 500
        response.release()
        return upstream_error(
            self.upstream,
            response.status,
            raw=raw,
            retry_after=response.headers.get("retry-after"),
            content_type=response.headers.get("content-type"),
        )

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
        except UNREACHABLE as err:
            raise upstream_error(self.upstream, err) from err

    async def _get_json(self, path: str) -> tuple[int, Mapping[str, Any] | None]:
        """GET ``path``: (status, its JSON object or None)."""
        status, raw = await self._get(path)
        return status, json_object(raw)

    async def _fetch_models(self) -> list[ModelCard]:
        status, raw = await self._get("/v1/models")
        if status != 200:
            # Never reaches a client (models() and start() fall back to the cached cards).
            if self.kind is None:
                await self._settle_kind("openai", f"/v1/models answered {status}")
            raise upstream_error(self.upstream, status, raw=raw)
        doc = json_object(raw) or {}
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
        except UNREACHABLE as err:
            raise upstream_error(self.upstream, err) from err
        finally:
            response.release()
        if response.status != 200:
            raise upstream_error(
                self.upstream, response.status, raw=raw, content_type=response.headers.get("Content-Type")
            )

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
        except UNREACHABLE as err:
            return Health(False, f"upstream unreachable: {err}")
