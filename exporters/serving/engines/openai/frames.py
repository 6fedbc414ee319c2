"""The proxy's SSE frame accounting: what the bytes of one streamed upstream response carry.

Pure: bytes in, :class:`~exporters.serving.engine.OutputEvent` out. No sockets, no event loop, no clock, no
metrics; the stream (``stream.py``) stamps the times and delivers the events.

Each upstream read (one chunk, or several when the proxy fell behind) becomes **one** event: the complete SSE
frames, forwarded as they came in one write (``wire_frames``), plus the token count, finish reason and usage
read from them by byte search. A read that is the last plain content chunk's bytes around another plain
string (most of a stream: only the text changes) is counted in one match instead (``FrameReader._learn``).
Only the few chunks that need more go through ``json.loads``: the finishing chunk, the usage-only chunk, a
chunk with usage the client did not ask for (stripped), anything not compact JSON. A partial frame waits for
the next read.
"""

from __future__ import annotations

import json
import re

from exporters.serving.engine import FinishReason, GenerationRequest, OutputEvent
from exporters.serving.engines.openai.errors import upstream_error
from loadlens.util import sse

_FINISH = {r.value: r for r in FinishReason}
_FINGERPRINT = re.compile(rb'"system_fingerprint":("(?:[^"\\]|\\.)*")')
_PLAIN_STRING = re.compile(rb'(?!"error"\Z)"[^"\\\n]+"')
"""A non-empty JSON string with no quote, escape or line break inside (nor ``"error"``, which ``_fast``
leaves to the JSON path)."""

TOKEN_SOURCES = ("usage", "final_usage", "chunks")
"""Where a finished stream's output-token counts came from (``loadlens_proxy_token_counts_total{source}``):

- ``usage``: content chunks carried ``usage.completion_tokens`` (continuous usage stats): each output event's
  token count is the upstream's;
- ``final_usage``: one token per content chunk, the total corrected by the upstream's final usage (a
  ``choices: []`` chunk, or a total on a late chunk): the fallback, exact in total, per event assumed;
- ``chunks``: the upstream sent no usage at all: one token per content chunk, total included (an estimate).
"""


class FrameReader:
    """Reads one upstream SSE response, read by read (:meth:`feed`).

    ``chat``: chat chunks (``delta.content``), else completions (``text``). ``client_streams``: the client
    asked to stream, so frames are forwarded (``wire_frames``) and no text is assembled; else each event
    carries the new text. ``keep_usage`` / ``keep_final_usage``: the client asked for usage on every chunk
    (``continuous_usage_stats``) / for the final usage chunk (``include_usage``); usage it did not ask for is
    counted, then stripped. ``upstream`` names the upstream in errors.

    After each read: ``prompt_tokens`` and ``output_tokens`` (cumulative), ``finished`` (a finishing chunk
    was seen), ``ended`` (``[DONE]`` was seen: later bytes are not read), ``source`` (where the counts came
    from, ``TOKEN_SOURCES``; None until usage was seen: ``chunks``).
    """

    def __init__(
        self,
        upstream: str,
        *,
        chat: bool,
        client_streams: bool,
        keep_usage: bool = False,
        keep_final_usage: bool = False,
    ) -> None:
        self._upstream = upstream
        self._chat = chat
        self._text_key = b'"content"' if chat else b'"text"'
        self._client_streams = client_streams
        self._keep_usage = keep_usage
        self._keep_final_usage = keep_final_usage
        # Where this stream's token counts came from (TOKEN_SOURCES): "usage" once a content chunk carried a
        # running count, "final_usage" once a total came after content without one; None: content chunks.
        self.source: str | None = None
        self._content_chunks = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.finished = False
        self.ended = False  # [DONE] seen
        self._buf = b""
        # The last plain content chunk's bytes around its text value (``_learn``): a read that is the same
        # bytes around another plain string is that chunk again with other text (``feed``).
        self._head: bytes | None = None  # None: nothing learned
        self._tail = b""
        self._head_len = self._tail_len = 0
        # Per read: what the frames of this read carried.
        self._tokens = 0
        self._texts: list[str] = []
        self._finish: FinishReason | None = None
        self._stop_reason: str | None = None
        # A client that asked for no usage gets the finishing chunk with the system_fingerprint of the usage
        # chunk the proxy asked for and drops (where the upstream would have put it): the finishing frame waits
        # for it (``_feed_frames``), at most until [DONE] or the end (``take_held``).
        self._hold = client_streams and not keep_final_usage
        self._held: bytes | None = None
        self._fingerprint: bytes | None = None

    @classmethod
    def for_request(cls, request: GenerationRequest, upstream: str) -> FrameReader:
        """The reader for what ``request``'s client asked for (its endpoint, stream flag and stream options)."""
        options = request.body.get("stream_options") or {}
        return cls(
            upstream,
            chat=request.endpoint == "chat",
            client_streams=request.stream_requested,
            keep_usage=bool(options.get("continuous_usage_stats")),
            keep_final_usage=bool(options.get("include_usage")),
        )

    def feed(self, data: bytes) -> OutputEvent | None:
        """The event for one read: every complete frame in it (a partial one waits for the next read); None
        when the read completed no frame that changes a count or is forwarded. Raises EngineError for
        invalid JSON or an error event in the stream."""
        if self._client_streams and not self._buf and self._held is None:
            # The common read: one plain content chunk for a streaming client, forwarded as it came.
            if self.plain(data):
                return OutputEvent("", 1, self.prompt_tokens, self.output_tokens, wire_frames=data)
            if data.startswith(b"data: {") and data.endswith(b"}\n\n") and data.find(b"\n", 7) == len(data) - 2:
                before = self.output_tokens
                if self._fast(data[6:-2]):
                    tokens = self.output_tokens - before
                    if tokens == 1:
                        self._learn(data)
                    return OutputEvent("", tokens, self.prompt_tokens, self.output_tokens, wire_frames=data)
                self._tokens = 0  # the JSON path reads it again from the start
        return self._feed_frames(data)

    def plain(self, data: bytes) -> bool:
        """Read ``data`` if it is the learned plain content chunk again with other text (``_learn``), for a
        streaming client with nothing buffered or held: counted (one token) and True, and its event is
        ``OutputEvent("", 1, prompt_tokens, output_tokens, wire_frames=data)``, which :meth:`feed` returns
        for it; else False and nothing read (then :meth:`feed` reads it)."""
        head = self._head
        if (
            head is not None
            and self._client_streams
            and not self._buf
            and self._held is None
            and data.startswith(head)
            and data.endswith(self._tail)
            and _PLAIN_STRING.fullmatch(data, self._head_len, len(data) - self._tail_len) is not None
        ):
            # The learned chunk's bytes around one other string without quotes, escapes or line breaks inside:
            # every search of _fast finds what it found in the learned chunk (no key it looks for can start or
            # end inside such a string), so it would count this one token the same.
            self.output_tokens += 1
            self._content_chunks += 1
            return True
        return False

    def _learn(self, data: bytes) -> None:
        """Keep the bytes around the text value of ``data``, one plain content chunk that ``_fast`` counted
        one token for, when that value is a non-empty string without escapes and the chunk has no usage (its
        counts would change). Its next reads then match in two comparisons (:meth:`feed`)."""
        j = data.find(self._text_key)
        if j < 0 or b'"usage":{' in data:
            return
        start = j + len(self._text_key) + 1  # the opening quote
        if data[start - 1 : start + 1] != b':"':
            return
        end = data.find(b'"', start + 1) + 1  # after the closing quote
        if end <= start + 2 or b"\\" in data[start:end] or data[end : end + 1] not in (b",", b"}"):
            return
        self._head, self._tail = data[:start], data[end:]
        self._head_len, self._tail_len = start, len(data) - end

    def take_held(self) -> bytes | None:
        """The finishing frame still held for a fingerprint when the stream ended without [DONE] (then sent as
        it came), None when nothing is held."""
        held, self._held = self._held, None
        return None if held is None else held + b"\n\n"

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
        held_now = False
        prompt_before, output_before = self.prompt_tokens, self.output_tokens
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
                self.ended = True
                if self._held is not None:
                    pieces.append(self._held)
                    self._held = None
                break  # the HTTP layer writes its own [DONE]
            finished_before = self.finished or self._finish is not None
            kept: bool | bytes | None = self._fast(payload)
            if kept is None:
                kept = self._slow(payload)
            piece = frame if kept is True else None if kept is False else b"data: " + kept
            if kept is not True:
                verbatim = False
            if (
                piece is not None
                and self._hold
                and not finished_before
                and self._finish is not None
                and b'"system_fingerprint"' not in piece
            ):
                self._held, piece, verbatim, held_now = piece, None, False, True
            elif self._held is not None and kept is False and self._fingerprint is not None:
                # The dropped usage chunk's fingerprint goes on the held finishing chunk, last, where vLLM
                # writes it when no usage was asked for (its stream responses' last field set).
                piece = self._held[:-1] + b',"system_fingerprint":' + self._fingerprint + b"}"
                self._held = None
            if piece is not None:
                if self._held is not None:  # a frame after the held one (n > 1): in the upstream's order
                    pieces.append(self._held)
                    self._held, verbatim = None, False
                pieces.append(piece)
        wire: bytes | None = None
        if self._client_streams and pieces:
            wire = complete if verbatim else b"\n\n".join(pieces) + b"\n\n"
        elif held_now:
            wire = b""  # the finishing chunk comes with the next frames: nothing to write now
        tokens, finish = self._tokens, self._finish
        if (
            wire is None
            and not tokens
            and finish is None
            and prompt_before == self.prompt_tokens
            and output_before == self.output_tokens
        ):
            return None
        if finish is not None:
            self.finished = True
        text = ""
        if self._texts:
            text = "".join(self._texts)
            self._texts.clear()
        return OutputEvent(
            text,
            tokens,
            self.prompt_tokens,
            self.output_tokens,
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
            new_tokens = max(0, completion - self.output_tokens)
        if nonempty:
            self._content_chunks += 1
        self.output_tokens += new_tokens
        self._tokens += new_tokens
        if text and not self._client_streams:
            self._texts.append(text)

    def _note_count(self, nonempty: bool) -> None:
        """A choice chunk carried ``usage.completion_tokens``: a running count when no content came before it
        without one (continuous usage stats), else a total on a late chunk (older llama.cpp's finish chunk,
        TGI's last completions chunk)."""
        if self.source is None:
            self.source = "usage" if self._content_chunks == 0 else "final_usage"

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
                self.prompt_tokens = prompt
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
                self.output_tokens += 1
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
                self.prompt_tokens = prompt
            if isinstance(used, int):
                completion = used
        choices = chunk.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else None
        if choice is None:
            # The usage-only chunk after the finishing one: exact totals; forwarded only if asked for.
            if completion is not None:
                self.output_tokens = max(self.output_tokens, completion)
                if self.source is None:
                    self.source = "final_usage"
            if self._held is not None:
                found = _FINGERPRINT.search(payload)
                self._fingerprint = found.group(1) if found is not None else None
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


def _data_of(frame: bytes) -> bytes | None:
    """The data of one SSE event with several lines: its ``data:`` lines joined (SSE: one optional space after
    the colon), None when it has none."""
    parts = [line[5:].removeprefix(b" ") for line in frame.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(parts) if parts else None
