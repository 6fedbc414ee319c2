"""One streamed request over geventhttpclient, read line by line as bytes arrive.

``HTTPSocketResponse.readline`` returns as soon as a newline is in its buffer and otherwise calls ``recv`` once
for whatever the kernel has, so each SSE event is timestamped when it arrives. Locust's
``FastResponse.iter_content``/``iter_lines`` instead wait for 1 KiB (about five events) and would smear TTFT
and ITL; they are deliberately not used.

Only imported inside Locust processes (gevent monkey patching happens in the locustfile).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import gevent
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError

from loadgen.prompts import PreparedRequest
from loadgen.record import RequestRecord, outcome_for_status
from loadgen.sse import StreamParser

_trace_rng = random.Random()  # system-seeded: trace ids must differ between runs, unlike prompts
MAX_ERROR_BODY = 64 * 1024


def traceparent() -> str:
    """A fresh W3C trace context (version 00, sampled), so server spans of each request are findable."""
    return f"00-{_trace_rng.getrandbits(128) or 1:032x}-{_trace_rng.getrandbits(64) or 1:016x}-01"


class Target:
    """The base URL split for geventhttpclient: a path prefix is kept, a trailing /v1 is dropped."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"target must be an http(s) URL, got {url!r}")
        self.url = url
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/").removesuffix("/v1")

    def client(self, timeout: float) -> HTTPClient:
        return HTTPClient(
            self.host,
            self.port,
            ssl=self.scheme == "https",
            concurrency=1,  # one connection per user: a user has one request in flight
            connection_timeout=min(10.0, timeout),
            # No per-read timeout: gevent would arm and cancel a timer on every recv (~15 % of the client's
            # CPU per token). ``stream`` bounds the whole request with one timer instead.
            network_timeout=None,  # type: ignore[arg-type]  # None = blocking (gevent-cooperative) reads
        )


def _error_reason(status: int, body: bytes) -> str:
    """``HTTP 429 RateLimitError``: status and error type only, so failure reasons stay a small set."""
    kind = ""
    try:
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            kind = str(err.get("type") or err.get("code") or "")
    except ValueError:
        pass
    return f"HTTP {status} {kind}".strip()


class _RequestTimeout(Exception):
    """Raised by the per-request timer inside ``stream``."""


def stream(
    http: HTTPClient,
    target: Target,
    request: PreparedRequest,
    headers: dict[str, str],
    intended_start: float,
    on_tokens: Callable[[int], None],
    timeout: float,
) -> tuple[RequestRecord, bool, float | None]:
    """Send ``request`` and measure it from ``intended_start`` (a ``time.perf_counter()`` value).

    Returns (record, connection_reusable, retry_after_seconds). The whole request (connect, headers, stream)
    may take ``timeout`` seconds. Exceptions other than transport errors (in particular ``GreenletExit`` when
    Locust stops the user) propagate; the caller closes the client.
    """
    timer = gevent.Timeout(timeout, _RequestTimeout)
    timer.start()
    try:
        return _stream(http, target, request, headers, intended_start, on_tokens)
    except _RequestTimeout:
        return RequestRecord(outcome="timeout", reason=f"no complete response within {timeout:g} s"), False, None
    finally:
        timer.cancel()


def _stream(
    http: HTTPClient,
    target: Target,
    request: PreparedRequest,
    headers: dict[str, str],
    intended_start: float,
    on_tokens: Callable[[int], None],
) -> tuple[RequestRecord, bool, float | None]:
    # Conversations send the reply back in the next turn: only their requests keep the streamed text.
    collect = request.traffic.conversation is not None
    parser = StreamParser(chat=request.traffic.endpoint == "chat", start=intended_start, collect=collect)
    try:
        response = http.request("POST", target.prefix + request.path, body=request.body, headers=headers)
    except TimeoutError as err:
        return RequestRecord(outcome="timeout", reason=f"timeout before response headers: {err}"), False, None
    except (OSError, HTTPConnectionClosed, HTTPParseError) as err:
        return RequestRecord(outcome="connection_error", reason=f"{type(err).__name__}: {err}"), False, None
    status = response.status_code
    if status != 200:
        try:
            body = response.read(MAX_ERROR_BODY)
            reusable = response.message_complete
        except (OSError, HTTPConnectionClosed, HTTPParseError):
            body, reusable = b"", False
        finally:
            response.release()
        reason = _error_reason(status, body)
        retry_after: float | None = None
        raw = response.get("retry-after")
        if isinstance(raw, str):
            try:
                retry_after = float(raw)
            except ValueError:
                retry_after = None
        record = RequestRecord(outcome=outcome_for_status(status), reason=reason, status=status)
        record.e2e = time.perf_counter() - intended_start
        return record, reusable, retry_after
    readline = response.readline
    perf = time.perf_counter
    seen = 0
    clean = False
    try:
        while True:
            line = readline(b"\n")
            t = perf()
            if not line:
                clean = True  # end of body
                break
            done = parser.feed(line, t)
            if parser.tokens != seen:
                on_tokens(parser.tokens - seen)
                seen = parser.tokens
            if done:
                # Drain what follows [DONE] (the chunked terminator) so the connection can be reused.
                while readline(b"\n"):
                    pass
                clean = True
                break
    except (OSError, HTTPConnectionClosed, HTTPParseError) as err:
        parser.error = parser.error or f"connection lost mid-stream: {type(err).__name__}"
    finally:
        response.release()
    record = parser.finish(perf(), status=status)
    return record, clean and not response.should_close(), None
