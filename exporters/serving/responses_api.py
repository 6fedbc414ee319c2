"""``POST /v1/responses`` (the OpenAI Responses API, which vLLM serves): request model, parsing into the
chat generation the engine runs, and the response body / SSE event stream.

A Responses request is a chat request in another shape: ``instructions`` becomes a system message and
``input`` (a string, or a list of message items) the messages; ``max_output_tokens`` is ``max_tokens``. The
engine runs it as a chat generation, so its metrics and spans are the chat ones (operation ``chat``), with
``path=/v1/responses`` in the request log. Nothing is stored: ``store`` is accepted and ignored (the response
says ``"store": false``), ``previous_response_id`` and ``background`` are refused. The ``openai`` proxy
engine does not translate: it answers 501 (call the upstream's own ``/v1/responses``).

Streaming follows the OpenAI event sequence: ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, one ``response.output_text.delta`` per
output event, ``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``,
then ``response.completed`` (its response's ``status`` is ``incomplete`` when ``max_output_tokens`` cut it, as
vLLM sends it, so SDK helpers waiting for ``response.completed`` finish), each as
``event: <type>`` plus ``data: {json}`` with a ``sequence_number``. There is no ``[DONE]`` line. An engine
error after the stream started is an ``error`` event.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from starlette.types import Send

from exporters.serving.engine import EngineError, SamplingParams
from exporters.serving.errors import engine_error_reason, engine_error_status
from exporters.serving.protocol import (
    INT64_MAX,
    INT64_MIN,
    MAX_TOKENS_LIMIT,
    OpenAIModel,
    ParsedRequest,
    _check_image_url,
    _Float,
    _validation_error,
)
from exporters.serving.streaming import GenerationResponse, send_json

# --- request ----------------------------------------------------------------------------------------------


class InputText(OpenAIModel):
    type: Literal["input_text", "output_text"]
    text: str


class InputImage(OpenAIModel):
    type: Literal["input_image"]
    image_url: str

    @field_validator("image_url")
    @classmethod
    def _check(cls, url: str) -> str:
        _check_image_url(url)
        return url


class InputMessage(OpenAIModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText | InputImage] = Field(min_length=1)


class ResponsesRequest(OpenAIModel):
    """``POST /v1/responses``: the fields loadlens honours (others are accepted and ignored, as vLLM does)."""

    model: str | None = None
    input: str | list[InputMessage] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: _Float | None = Field(default=None, ge=0.0)
    top_p: _Float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool | None = False
    store: bool | None = True
    background: Literal[False] | None = Field(default=False, description="background responses need a store")
    previous_response_id: None = Field(default=None, description="not supported: nothing is stored")
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    ignore_eos: bool | None = False


def parse_responses_request(body: dict[str, Any]) -> ParsedRequest:
    try:
        req = ResponsesRequest.model_validate(body)
    except ValidationError as err:
        raise _validation_error(err) from None
    parts: list[str] = []
    images = 0
    if req.instructions:
        parts.append(f"<|system|>{req.instructions}")
    if isinstance(req.input, str):
        parts.append(f"<|user|>{req.input}")
    else:
        for item in req.input:
            if isinstance(item.content, str):
                parts.append(f"<|{item.role}|>{item.content}")
                continue
            texts = [c.text for c in item.content if isinstance(c, InputText)]
            images += sum(1 for c in item.content if isinstance(c, InputImage))
            parts.append(f"<|{item.role}|>" + "\n".join(texts))
    parts.append("<|assistant|>")
    sampling = SamplingParams(
        max_tokens=req.max_output_tokens or 0,  # 0: what the context leaves, as vLLM
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        ignore_eos=bool(req.ignore_eos),
    )
    return ParsedRequest(
        endpoint="chat",
        model=req.model,
        prompt="\n".join(parts),
        image_count=images,
        sampling=sampling,
        stream=bool(req.stream),
        include_usage=False,
        continuous_usage_stats=False,
        priority=req.priority,
        body=body,
    )


# --- response ---------------------------------------------------------------------------------------------


class ResponsesAPIResponse(GenerationResponse):
    """Runs an admitted Responses request; disconnects, aborts and unexpected errors as every generation."""

    def _ids(self) -> tuple[str, str]:
        return "resp_" + self.life.request_id, "msg_" + self.life.request_id

    def _response(
        self, status: str, output: list[dict[str, Any]], finish_reason: str | None, cached: int, created: int
    ) -> dict[str, Any]:
        body = self.parsed.body
        sp = self.parsed.sampling
        life = self.life
        usage = None
        if status != "in_progress":
            usage = {
                "input_tokens": life.prompt_tokens,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": life.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": life.prompt_tokens + life.output_tokens,
            }
        return {
            "id": self._ids()[0],
            "object": "response",
            "created_at": created,
            "model": self.model,
            "status": status,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "store": False,
            "background": False,
            "previous_response_id": None,
            "service_tier": "auto",
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": usage,
            "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else None,
            "user": None,
        }

    def _message(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
        return {"id": self._ids()[1], "type": "message", "status": status, "role": "assistant", "content": content}

    @staticmethod
    def _status(finish_reason: str | None) -> str:
        return "incomplete" if finish_reason == "length" else "completed"

    async def _whole(self, send: Send) -> None:
        life = self.life
        created = int(time.time())
        try:
            text, finish_reason, _, cached, _ = await self._collect()
        except EngineError as err:
            await self._refuse_whole(err, send)
            return
        status = self._status(finish_reason)
        output = [self._message(text, status)]
        payload = json.dumps(self._response(status, output, finish_reason, cached, created)).encode()
        self._finished_producing = True
        life.finish_ok(finish_reason, self.engine_stream.timing, cached)
        await send_json(send, payload, life.request_id)

    async def _stream(self, send: Send) -> None:
        life = self.life
        created = int(time.time())
        _, item_id = self._ids()
        seq = 0

        def event(kind: str, **fields: Any) -> bytes:
            nonlocal seq
            data = json.dumps({"type": kind, "sequence_number": seq, **fields})
            seq += 1
            return f"event: {kind}\ndata: {data}\n\n".encode()

        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-request-id", life.request_id.encode()),
                ],
            }
        )
        opening = self._response("in_progress", [], None, 0, created)
        head = (
            event("response.created", response=opening)
            + event("response.in_progress", response=opening)
            + event("response.output_item.added", output_index=0, item=self._message(None, "in_progress"))
            + event("response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []})
        )
        await send({"type": "http.response.body", "body": head, "more_body": True})
        parts: list[str] = []
        finish_reason: str | None = None
        cached = 0
        try:
            async for ev in self.engine_stream:
                life.on_event(time.monotonic(), ev.new_tokens, ev.prompt_tokens, ev.output_tokens)
                if ev.finish_reason is not None:
                    finish_reason = ev.finish_reason.value
                cached = ev.cached_tokens or cached
                if ev.text:
                    parts.append(ev.text)
                    body = event("response.output_text.delta", **where, delta=ev.text, logprobs=[])
                    await send({"type": "http.response.body", "body": body, "more_body": True})
        except EngineError as err:
            self._finished_producing = True
            status_code = engine_error_status(err)
            life.finish_error(status_code, engine_error_reason(err), err.message, self.engine_stream.timing)
            tail = event("error", code=str(status_code), message=err.message, param=err.param)
            await send({"type": "http.response.body", "body": tail, "more_body": False})
            return
        text = "".join(parts)
        status = self._status(finish_reason)
        message = self._message(text, status)
        final = self._response(status, [message], finish_reason, cached, created)
        tail = (
            event("response.output_text.done", **where, text=text, logprobs=[])
            + event("response.content_part.done", **where, part=message["content"][0])
            + event("response.output_item.done", output_index=0, item=message)
            + event("response.completed", response=final)
        )
        self._finished_producing = True
        life.finish_ok(finish_reason, self.engine_stream.timing, cached)
        await send({"type": "http.response.body", "body": tail, "more_body": False})


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}
