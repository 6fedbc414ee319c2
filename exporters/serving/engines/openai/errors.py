"""Upstream failures, translated: the one place that turns what went wrong upstream into an EngineError, and
that names why a request was sent again (``RETRY_REASONS``) or failed by the proxy itself
(``FAILURE_REASONS``).

Upstream errors keep their status and body. The proxy answers for itself only when the upstream could not be
used: 503 unreachable, 502 closed without answering / broken stream, 504 no answer in time, each counted by
reason; a try that provably never reached the upstream (a stale keep-alive connection) is sent again.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from exporters.serving.engine import EngineError, ErrorKind
from exporters.serving.engines.openai import upstream_http

UNREACHABLE = (aiohttp.ClientError, upstream_http.UpstreamHTTPError, TimeoutError, OSError)
"""What aiohttp and the streaming client raise when the upstream cannot be reached or stops answering."""


def json_object(raw: bytes) -> Mapping[str, Any] | None:
    """``raw`` as a JSON object, None when it is not one."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def upstream_error(
    upstream: str,
    failure: int | BaseException | str,
    *,
    raw: bytes = b"",
    retry_after: str | None = None,
    content_type: str | None = None,
) -> EngineError:
    """The one translation of an upstream failure into an EngineError, by what ``failure`` is:

    - an ``int``: the upstream answered with this non-200 status. Kept, with the upstream's message; a body
      (``raw``) that is a JSON object is forwarded byte for byte with its ``content_type``, any other body is
      wrapped in an OpenAI error naming it; ``Retry-After`` when given.
    - an exception: the request never got an answer (connection refused, DNS, timeout): 503.
    - a ``str``: an accepted stream went wrong (broken, cut short, bad JSON, an error event), described by
      the string: 502, since a gateway is what failed the client.
    """
    if isinstance(failure, int):
        parsed = json_object(raw)
        return EngineError(
            ErrorKind.UPSTREAM,
            _error_message(parsed, failure, raw),
            status=failure,
            body=raw if parsed is not None else None,
            content_type=content_type,
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

RETRY_REASONS = ("stale_connection", "connect")
"""Why a request was sent again (``loadlens_proxy_upstream_retries_total{reason}``); only requests that
provably never reached the upstream (:func:`retry_reason`)."""


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

    The streaming client (``upstream_http``, ``OpenAIProxyEngine._open_stream``) types the same cases:
    ``ConnectFailed`` (connect), ``ClosedBeforeAnswer`` on a reused connection without a byte of answer
    (``partial`` false: stale_connection).

    Every exception ``OpenAIProxyEngine._send`` sees comes from ``session.post``, i.e. before the status
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


def send_failure(upstream: str, reason: str, err: BaseException) -> EngineError:
    """The EngineError for a try that got no response (``reason`` from :func:`failure_reason`)."""
    if reason == "connect":
        return upstream_error(upstream, err)
    status = 504 if reason == "timeout" else 502
    what = {"timeout": "did not answer in time", "invalid_response": "sent an invalid response"}.get(
        reason, "closed the connection without answering"
    )
    return EngineError(ErrorKind.UPSTREAM, f"upstream {upstream} {what}: {err or type(err).__name__}", status=status)
