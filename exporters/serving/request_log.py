"""One structured log line per request, in logfmt (default) or JSON, with trace and span ids.

Lines go to the ``loadlens.request`` logger at INFO on stderr, so Loki/Promtail or any log shipper can parse
them and jump to the trace. Example (logfmt)::

    ts=2026-11-29T22:10:01.123Z level=info msg=request request_id=chatcmpl-9f.. trace_id=4bf9.. span_id=00f0..
    method=POST path=/v1/chat/completions model=tiny status=200 stream=true priority=0 priority_class=interactive
    prompt_tokens=12 output_tokens=64 ttft_ms=41.2 e2e_ms=655.0 finish_reason=length
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal

LogFormat = Literal["logfmt", "json"]
LOGGER_NAME = "loadlens.request"


def _logfmt_value(value: Any) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3f}"
    text = str(value)
    if text == "" or any(c in text for c in ' ="\\\n\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def format_logfmt(fields: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())


def format_json(fields: Mapping[str, Any]) -> str:
    return json.dumps(fields, separators=(",", ":"), default=str)


def _timestamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


class RequestLogger:
    def __init__(self, fmt: LogFormat = "logfmt", logger: logging.Logger | None = None) -> None:
        self._format = format_json if fmt == "json" else format_logfmt
        self._log = logger or logging.getLogger(LOGGER_NAME)

    def enabled(self, level: int) -> bool:
        """Whether a line at ``level`` would be written (callers skip building it when not)."""
        return self._log.isEnabledFor(level)

    def log(self, fields: Mapping[str, Any], level: int = logging.INFO) -> None:
        if not self._log.isEnabledFor(level):
            return
        line = {"ts": _timestamp(), "level": logging.getLevelName(level).lower(), "msg": "request", **fields}
        self._log.log(level, self._format(line))


def configure_logging(level: str = "info") -> None:
    """Plain message-only handler on stderr: our lines are already structured."""
    root = logging.getLogger("loadlens")
    if not any(getattr(h, "_loadlens", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._loadlens = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
