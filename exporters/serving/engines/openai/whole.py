"""A non-streamed answer relayed whole: the upstream's JSON body as it came, and what the proxy reads of it.

A client that does not stream gets the upstream's own body, byte for byte (``OutputEvent.whole_body``): the
proxy sent its request on unchanged, non-streamed, so the answer is the upstream's in every field (vLLM's
``system_fingerprint``, ``service_tier``, ``usage.*_tokens_details``, ``kv_transfer_params``, its id ...).
What the proxy measures of it is read from the body: token counts from ``usage``, the finish reason from the
first choice. An answer's tokens arrive at once, so it has no time to first token and no inter-token gaps
(docs/serving.md, *Proxy engine*).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporters.serving.engine import FinishReason, OutputEvent, RequestStream, RequestTiming
from exporters.serving.engines.openai.errors import json_object

_FINISH = {r.value: r for r in FinishReason}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def whole_event(raw: bytes, content_type: str | None) -> tuple[OutputEvent, bool]:
    """The one event of a whole answer ``raw``, and whether its body carried ``usage`` counts. A body that is
    not an OpenAI answer is still relayed as it came, with zero counts and no finish reason."""
    doc: Mapping[str, Any] = json_object(raw) or {}
    usage = doc.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    prompt, output = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    choices = doc.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    reason = choice.get("finish_reason")
    stop_reason = choice.get("stop_reason")
    event = OutputEvent(
        "",
        output,
        prompt,
        output,
        finish_reason=_FINISH.get(reason, FinishReason.STOP) if isinstance(reason, str) and reason else None,
        stop_reason=stop_reason if isinstance(stop_reason, str) else None,
        cached_tokens=cached,
        whole_body=raw,
        whole_content_type=content_type,
    )
    return event, "completion_tokens" in usage


class WholeAnswer(RequestStream):
    """The stream of a non-streamed relay: the answer has already arrived, so it is one event, then the end."""

    def __init__(self, request_id: str, event: OutputEvent, timing: RequestTiming) -> None:
        self.request_id = request_id
        self.timing = timing
        self._event: OutputEvent | None = event

    def usage(self) -> tuple[int, int, int] | None:
        """(prompt, completion, cached prompt tokens) of the upstream's answer; None when it had no usage counts
        (the MFU estimate, ``mfu.py``)."""
        e = self._event
        return None if e is None or not e.prompt_tokens else (e.prompt_tokens, e.output_tokens, e.cached_tokens)

    async def __anext__(self) -> OutputEvent:
        event, self._event = self._event, None
        if event is None:
            raise StopAsyncIteration
        return event

    async def aclose(self) -> None:
        self._event = None  # the upstream has answered: nothing is left to abort
