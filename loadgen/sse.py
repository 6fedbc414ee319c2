"""Turn an OpenAI streaming response, one SSE line at a time with its arrival time, into a RequestRecord.

The parser is transport-free so that it is tested exactly with scripted lines and times. The caller reads
the socket line by line as bytes arrive and calls :meth:`StreamParser.feed` with ``time.perf_counter()``
taken right after each line; reading in fixed blocks would batch several events under one timestamp.

Usage::

    parser = StreamParser(chat=True, start=intended_start)
    for line in lines:                       # b'data: {...}\\n', b'\\n', b'data: [DONE]\\n'
        if parser.feed(line, time.perf_counter()):
            break
    record = parser.finish(time.perf_counter())
"""

from __future__ import annotations

import json
from typing import Any

from loadgen.record import RequestRecord
from loadlens.util.sse import NOT_COMPACT as _NOT_COMPACT
from loadlens.util.sse import fast_fields as _fast_fields  # byte-level extraction, shared with the serving proxy
from loadlens.util.sse import string_value as _string_value

_loads = json.loads


class StreamParser:
    """Definitions (docs/loadgen.md):

    - TTFT: first chunk whose ``content`` (chat; or ``reasoning_content``) or ``text`` (completions) is non-empty;
      a role-only or empty first chunk does not count.
    - per-token ITL: when chunks carry ``usage.completion_tokens`` (continuous usage stats), a chunk that raises
      the count by k after a gap g since the previous token-bearing chunk gives k samples of g / k. Usage that
      first appears after content chunks without it (older llama.cpp servers: on the finish chunk, beside its
      ``choices``) is a total, like the final ``include_usage`` chunk: the chunk gaps stand in for ITL.
    - chunk gaps: time between consecutive non-empty content chunks (reported separately; the ITL fallback).
    - E2E: intended start to ``[DONE]``, or to the end of the body when a server omits ``[DONE]`` after a
      chunk with a ``finish_reason`` (TGI before 2.2 did); a body that ends before either is a stream error.
    """

    __slots__ = (
        "chat",
        "start",
        "first",
        "last_content",
        "last_token_time",
        "tokens",
        "usage_tokens",
        "prompt_tokens",
        "final_usage",
        "continuous",
        "itl",
        "gaps",
        "chunks",
        "done",
        "error",
        "finished",
        "text",
    )

    def __init__(self, *, chat: bool, start: float, collect: bool = False) -> None:
        self.chat = chat
        self.text: list[str] | None = [] if collect else None
        """With ``collect``: the streamed ``content`` (chat) or ``text`` pieces, for conversations (off by
        default: it costs a string decode per chunk)."""
        self.start = start
        self.first: float | None = None
        self.last_content: float | None = None
        self.last_token_time: float | None = None
        self.tokens = 0  # completion tokens seen so far (usage when present, else content chunks)
        self.usage_tokens = 0
        self.prompt_tokens = 0
        self.final_usage: int | None = None
        self.continuous = False
        self.itl: list[tuple[float, int]] = []
        self.gaps: list[float] = []
        self.chunks = 0
        self.done: float | None = None
        self.error = ""
        self.finished = False  # a chunk with a finish_reason came: the stream is complete even without [DONE]

    def feed(self, line: bytes, t: float) -> bool:
        """Consume one line received at ``t``; True when the stream is finished (``[DONE]`` or an error)."""
        if line[:5] != b"data:":
            return False  # blank separators, comments (':'), event:/id: fields
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = t
            return True
        fields = _fast_fields(payload, self.chat)
        if fields is None:
            fields = self._slow_fields(payload)
            if fields is None:
                self.done = t
                return True
        has_choices, nonempty, count, prompt = fields
        if not self.finished and has_choices:
            f = payload.find(b'"finish_reason":"')
            # TGI's completions chunks carry "" until the last one
            self.finished = f >= 0 and payload[f + 17 : f + 18] not in (b'"', b"")
        if not has_choices:
            # The final include_usage chunk ("choices": []): totals only, never an ITL sample.
            if count is not None:
                self.final_usage = count
            if prompt:
                self.prompt_tokens = prompt
            return False
        if nonempty:
            if self.text is not None:
                self._collect(payload)
            self.chunks += 1
            if self.first is None:
                self.first = t
            else:
                self.gaps.append(t - self.last_content)  # type: ignore[operator]
            self.last_content = t
            if not self.continuous:
                self.tokens += 1
        if count is not None and not self.continuous and self.chunks > (1 if nonempty else 0):
            # Content came before without usage, so this usage is no running count but a total on a chunk that
            # still carries choices: older llama.cpp servers put it on the finish chunk. A total, never ITL.
            self.final_usage = count
            if prompt:
                self.prompt_tokens = prompt
            return False
        if count is not None:
            if not self.continuous:
                self.continuous = True
                self.tokens = self.usage_tokens
            if prompt:
                self.prompt_tokens = prompt
            new = count - self.usage_tokens
            if new > 0:
                if self.last_token_time is not None:
                    self.itl.append(((t - self.last_token_time) / new, new))
                self.last_token_time = t
                self.usage_tokens = count
                self.tokens = count
        return False

    def _collect(self, payload: bytes) -> None:
        """Keep the chunk's reply text (chat ``content``, not ``reasoning_content``; completions ``text``)."""
        value = _string_value(payload, b'"content"' if self.chat else b'"text"')
        if value is _NOT_COMPACT:
            try:
                choice = (_loads(payload).get("choices") or [{}])[0]
                value = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
            except (ValueError, AttributeError, IndexError):
                value = None
        if isinstance(value, str) and value and self.text is not None:
            self.text.append(value)

    def _slow_fields(self, payload: bytes) -> tuple[bool, bool, int | None, int | None] | None:
        """The same fields through json.loads; None (with ``error`` set) for error events and bad JSON."""
        try:
            obj: dict[str, Any] = _loads(payload)
        except ValueError:
            self.error = "malformed SSE JSON"
            return None
        if not isinstance(obj, dict):
            self.error = "malformed SSE JSON"
            return None
        err = obj.get("error")
        if err is not None:
            message = err.get("message", "") if isinstance(err, dict) else str(err)
            kind = err.get("type", "error") if isinstance(err, dict) else "error"
            self.error = f"{kind}: {str(message)[:120]}"
            return None
        choices = obj.get("choices")
        usage = obj.get("usage") or {}
        count = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        if not choices:
            return False, False, count, prompt
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finished = True
        if self.chat:
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("reasoning_content")
        else:
            text = choice.get("text")
        return True, bool(text), count, prompt

    def finish(self, t_end: float, *, status: int = 200) -> RequestRecord:
        """The record of a stream that ended at ``t_end`` (used when ``[DONE]`` never came)."""
        end = self.done if self.done is not None else t_end
        record = RequestRecord(status=status, chunks=self.chunks, prompt_tokens=self.prompt_tokens)
        if self.error:
            record.outcome, record.reason = "stream_error", self.error
        elif self.done is None and not self.finished:
            record.outcome, record.reason = "stream_error", "stream ended without [DONE]"
        elif self.first is None:
            record.outcome, record.reason = "stream_error", "no content in the stream"
        if self.final_usage is not None:
            n = self.final_usage
            record.usage_reported = True
        elif self.continuous:
            n = self.usage_tokens
            record.usage_reported = True
        else:
            n = self.tokens
        record.output_tokens = n
        record.ttft = None if self.first is None else self.first - self.start
        record.e2e = end - self.start
        record.chunk_gaps = self.gaps
        record.itl = self.itl
        record.itl_source = "usage" if self.continuous else "chunk"
        if self.text is not None:
            record.content = "".join(self.text)
        return record
