"""OpenAI response and SSE chunk builders.

The streaming path builds chunks from pre-rendered prefixes plus ``json.dumps`` of the new text only, since
this runs once per token; the non-streaming bodies are built as dicts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from exporters.serving.engine import Endpoint

DONE = b"data: [DONE]\n\n"
_dumps = json.dumps


def _usage(prompt: int, completion: int, cached: int = 0) -> dict[str, object]:
    usage: dict[str, object] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


@dataclass(slots=True)
class ChunkWriter:
    """Renders one request's SSE ``data:`` lines."""

    endpoint: Endpoint
    response_id: str
    model: str
    created: int
    continuous_usage: bool
    _head: str = field(init=False, default="")

    def _render_head(self) -> str:
        """'{"id":...,"model":"m"' without the closing brace: chunks append their own fields. Rendered at the first
        chunk this writer writes, not when it is made: a proxied stream forwards the upstream's own chunks and
        most often never needs it."""
        if self.endpoint == "chat":
            head = {"id": self.response_id, "object": "chat.completion.chunk", "created": self.created}
        else:
            head = {"id": self.response_id, "object": "text_completion", "created": self.created}
        head["model"] = self.model
        self._head = _dumps(head, separators=(",", ":"))[:-1]
        return self._head

    def _usage_suffix(self, prompt: int, completion: int) -> str:
        if not self.continuous_usage:
            return ""
        return (
            f',"usage":{{"prompt_tokens":{prompt},"total_tokens":{prompt + completion},'
            f'"completion_tokens":{completion}}}'
        )

    def role(self, prompt: int) -> bytes:
        delta = '{"role":"assistant","content":""}'
        choice = f'{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":null}}'
        head = self._head or self._render_head()
        return f'data: {head},"choices":[{choice}]{self._usage_suffix(prompt, 0)}}}\n\n'.encode()

    def content(
        self, text: str, prompt: int, completion: int, finish_reason: str | None, stop_reason: str | None
    ) -> bytes:
        fr = "null" if finish_reason is None else f'"{finish_reason}"'
        sr = "null" if stop_reason is None else _dumps(stop_reason)
        if self.endpoint == "chat":
            delta = f'{{"content":{_dumps(text)}}}' if text or finish_reason is None else "{}"
            choice = f'{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{fr},"stop_reason":{sr}}}'
        else:
            choice = f'{{"index":0,"text":{_dumps(text)},"logprobs":null,"finish_reason":{fr},"stop_reason":{sr}}}'
        head = self._head or self._render_head()
        return f'data: {head},"choices":[{choice}]{self._usage_suffix(prompt, completion)}}}\n\n'.encode()

    def usage(self, prompt: int, completion: int, cached: int = 0) -> bytes:
        body = _dumps(_usage(prompt, completion, cached), separators=(",", ":"))
        return f'data: {self._head or self._render_head()},"choices":[],"usage":{body}}}\n\n'.encode()


def full_response(
    endpoint: Endpoint,
    response_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None,
    stop_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> dict[str, object]:
    if endpoint == "chat":
        choice: dict[str, object] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        obj = "text_completion"
    return {
        "id": response_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": _usage(prompt_tokens, completion_tokens, cached_tokens),
    }
