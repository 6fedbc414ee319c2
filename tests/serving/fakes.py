"""A scripted engine for HTTP-layer tests: fixed token timing, queue limit, injectable failures.

It exists so the HTTP layer's own behaviour (status codes, SSE framing, disconnects, metrics) is tested
independently of the simulator's model; the simulator is exercised end to end in test_sim_server.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

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


class _Stream(RequestStream):
    def __init__(self, engine: ScriptedEngine, request: GenerationRequest, n: int) -> None:
        self.engine = engine
        self.request_id = request.request_id
        self.timing = RequestTiming(queued=request.arrival_time, scheduled=request.arrival_time)
        self.request = request
        self.n = n
        self.sent = 0
        self.closed = False
        self.prompt_tokens = max(1, len(request.prompt.split())) + 10 * request.image_count

    async def __anext__(self) -> OutputEvent:
        if self.closed or self.sent >= self.n:
            raise StopAsyncIteration
        hold = self.engine.hold
        # A thread's Event, polled: the test sets it from its own thread, and asyncio.Event is not thread-safe.
        while self.sent == 0 and hold is not None and not hold.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        await asyncio.sleep(self.engine.ttft_s if self.sent == 0 else self.engine.itl_s)
        if self.engine.fail_after is not None and self.sent >= self.engine.fail_after:
            self.closed = True
            self.engine.active.discard(self.request_id)
            raise EngineError(ErrorKind.INTERNAL, "scripted engine failure")
        if self.engine.crash_after is not None and self.sent >= self.engine.crash_after:
            self.closed = True
            self.engine.active.discard(self.request_id)
            raise RuntimeError("scripted bug mid-stream")
        self.sent += 1
        last = self.sent == self.n
        if self.sent == 1:
            self.timing.first_token = asyncio.get_running_loop().time()
        if last:
            self.closed = True
            self.engine.active.discard(self.request_id)
            self.timing.finished = asyncio.get_running_loop().time()
            self.timing.lora_blocked_seconds = self.engine.lora_blocked_s if self.request.lora else 0.0
        return OutputEvent(
            text=f"t{self.sent} ",
            new_tokens=1,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.sent,
            finish_reason=(FinishReason.LENGTH if last else None),
        )

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self.engine.active.discard(self.request_id)
            self.engine.aborted.append(self.request_id)


class ScriptedEngine(Engine):
    name = "scripted"

    def __init__(self, *, ttft_s: float = 0.01, itl_s: float = 0.002, max_active: int = 1000) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.max_active = max_active
        self.active: set[str] = set()
        self.aborted: list[str] = []
        self.adapters: dict[str, LoRARequest] = {}
        self.fail_after: int | None = None
        self.crash: Exception | None = None
        """Raised by ``generate`` (a bug, not an EngineError)."""
        self.crash_after: int | None = None
        """After this many tokens the stream raises RuntimeError (a bug, not an EngineError)."""
        self.healthy = True
        self.lora_blocked_s = 0.0
        self.last_request: GenerationRequest | None = None
        self.hold: threading.Event | None = None
        """When set to an Event, every stream waits for it before its first token: a test holds requests
        active (and their connections busy) until it has seen what it wants, then sets it."""
        self._knobs: dict[str, Any] = {"max_num_seqs": 8}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self.active.clear()

    async def generate(self, request: GenerationRequest) -> RequestStream:
        self.last_request = request
        if self.crash is not None:
            raise self.crash
        if request.model != "scripted" and request.model not in self.adapters:
            raise EngineError(ErrorKind.NOT_FOUND, f"The model `{request.model}` does not exist.", param="model")
        if not self.healthy:
            raise EngineError(ErrorKind.UNAVAILABLE, "engine is down")
        if len(self.active) >= self.max_active:
            raise EngineError(ErrorKind.QUEUE_FULL, "waiting queue is full", retry_after_seconds=2.4)
        if request.sampling.max_tokens > 1000:
            raise EngineError(ErrorKind.INVALID_REQUEST, "too long", param="max_tokens")
        self.active.add(request.request_id)
        return _Stream(self, request, request.sampling.max_tokens or 5)

    async def abort(self, request_id: str) -> None:
        self.active.discard(request_id)

    async def models(self) -> list[ModelCard]:
        return [ModelCard("scripted", max_model_len=2048)] + [
            ModelCard(name, parent="scripted", root=lora.lora_path) for name, lora in self.adapters.items()
        ]

    async def load_adapter(self, lora: LoRARequest) -> None:
        self.adapters[lora.lora_name] = lora

    async def unload_adapter(self, lora_name: str) -> None:
        if self.adapters.pop(lora_name, None) is None:
            raise EngineError(ErrorKind.NOT_FOUND, "unknown adapter")

    def knobs(self) -> dict[str, Any]:
        return dict(self._knobs)

    async def set_knobs(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        for key, value in changes.items():
            if key not in self._knobs:
                raise EngineError(ErrorKind.INVALID_REQUEST, f"unknown knob {key!r}", param=key)
            if not isinstance(value, int) or value < 1:
                raise EngineError(ErrorKind.INVALID_REQUEST, f"{key} must be a positive integer", param=key)
        self._knobs.update(changes)
        return dict(self._knobs)

    async def health(self) -> Health:
        return Health(self.healthy, "" if self.healthy else "scripted outage")
