"""The engine interface: what the HTTP layer needs from whatever generates tokens.

The HTTP layer knows requests, streams and errors; it knows no engine internals and never asks which
engine it has. The shape follows vLLM's ``AsyncLLM``, so an engine inside vLLM's process could fit it one-to-one (none
exists: a real vLLM runs as its own server behind the ``openai`` proxy)::

    vLLM:    async for out in llm.generate(prompt, params, request_id, lora_request=..., priority=...,
                                           trace_headers=...)
             await llm.abort(request_id)
    here:    stream = await engine.generate(request)    # admission: raises EngineError before any output
             async for event in stream: ...              # OutputEvents until one has finish_reason
             await stream.aclose()                       # client went away: aborts in the engine

``generate`` is a coroutine that returns the stream (rather than an async generator) so that admission
errors - prompt too long, queue full, unknown adapter, upstream 4xx - surface before the HTTP layer has sent
a status line, and become proper 4xx/5xx responses.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

Endpoint = Literal["chat", "completions"]


class FinishReason(enum.StrEnum):
    """Values of vLLM's ``finished_reason`` label (the ones the sim and proxy produce)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class ErrorKind(enum.StrEnum):
    """Why an engine refused or failed a request. Its HTTP status and metrics reason are in one table,
    ``exporters.serving.errors.REFUSALS``."""

    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"  # unknown model or adapter
    QUEUE_FULL = "queue_full"
    UNAVAILABLE = "unavailable"  # engine not ready, upstream unreachable
    UPSTREAM = "upstream"  # the proxied server's status is forwarded
    INTERNAL = "internal"  # a bug or engine crash


class EngineError(Exception):
    """A refusal or failure with enough detail for an OpenAI-style error body.

    ``status`` is only used for ``ErrorKind.UPSTREAM`` (the proxied server's status); ``body`` is the
    upstream's own error body, a JSON object, as the bytes it sent (forwarded byte for byte, with
    ``content_type``, the upstream's ``Content-Type``), when there is one.
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        param: str | None = None,
        status: int | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.status = status
        self.body = body
        self.content_type = content_type
        self.retry_after_seconds = retry_after_seconds


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    """Upper bound on output tokens; 0 means "not given": the engine allows what the context leaves (vLLM)."""
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """vLLM's LoRARequest fields: equality by name, integer id >= 1."""

    lora_name: str
    lora_int_id: int
    lora_path: str


@dataclass(slots=True)
class GenerationRequest:
    request_id: str
    endpoint: Endpoint
    model: str
    """The served name the client asked for: the base model or a loaded adapter."""
    prompt: str
    """Prompt text (chat messages rendered with a simple template; images excluded)."""
    image_count: int
    """Number of ``image_url`` parts; the engine turns them into prompt tokens as its model does."""
    sampling: SamplingParams
    arrival_time: float
    """``time.monotonic()`` when the HTTP layer received the request (TTFT is measured from here)."""
    priority: int = 0
    lora: LoRARequest | None = None
    trace_headers: Mapping[str, str] | None = None
    body: Mapping[str, Any] = field(default_factory=dict)
    """The validated client JSON body, for engines that forward it (the proxy)."""
    stream_requested: bool = True
    """Whether the client asked to stream; engines may use it to choose an upstream mode."""


@dataclass(slots=True)
class RequestTiming:
    """Timing marks the engine knows (``time.monotonic()``); ``None`` where the engine cannot know them.

    The HTTP layer owns arrival and emission times; these marks feed span events and the queue/prefill/
    decode split. The proxy engine knows none of the scheduler marks.
    """

    queued: float | None = None
    scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    lora_blocked_seconds: float = 0.0
    """Time this request spent blocked behind adapter loads (guide 2.4 hot-swap blocking)."""
    preemptions: int = 0


@dataclass(slots=True)
class OutputEvent:
    """One step of output for one request. The last event of a stream has ``finish_reason`` set."""

    text: str
    """New text since the previous event."""
    new_tokens: int
    """Output tokens this event carries (one SSE chunk may carry several)."""
    prompt_tokens: int
    """Prompt tokens as the engine counted them (images included)."""
    output_tokens: int
    """Cumulative output tokens including this event."""
    finish_reason: FinishReason | None = None
    stop_reason: str | None = None
    cached_tokens: int = 0
    wire_frames: bytes | None = None
    """Complete SSE frames (``data: {json}\n\n``, one or several) from an upstream, written to streaming
    clients as they are (proxy engines); ``None`` lets the HTTP layer build the chunk. An event carrying
    several frames counts their tokens in ``new_tokens`` and is sent in one write."""
    role: str | None = None
    """Set on a first chunk that only announces the assistant role (OpenAI chat streaming)."""
    whole_body: bytes | None = None
    """The upstream's complete non-streamed answer (a proxy engine relays a non-streaming client's request as
    it came): the HTTP layer sends these bytes as the response body, with ``whole_content_type``, instead of
    building one. Its tokens came at once, with no arrival times of their own: the event counts them, sets
    no first token and no inter-token gap (the request is measured by its duration)."""
    whole_content_type: str | None = None


PlainSink = Callable[[bytes, int, int], bool]
"""``RequestStream.deliver_to``'s ``plain``: (frames, prompt tokens, output tokens) -> taken."""


class RequestStream(abc.ABC):
    """The output of one admitted request. Iterate it; ``aclose`` aborts the request if unfinished.

    Exactly one event carries ``finish_reason``. Engines that build their own events end the stream there;
    a proxy may follow it with one usage-only event (``new_tokens == 0``, final counts, the upstream's usage
    chunk as ``wire_frames``), because OpenAI servers send usage after the finishing chunk.
    """

    request_id: str
    timing: RequestTiming
    batched_writes: ClassVar[bool] = False
    """Whether the events ``deliver_to`` hands over come from socket reads, one read at a time (a proxy): the
    HTTP layer then writes their chunks at the end of the loop's pass over the ready sockets, together
    (``direct_body.WriteBatch``), not at once. Engines that make a step's events in one callback need not."""

    def __aiter__(self) -> AsyncIterator[OutputEvent]:
        return self

    @abc.abstractmethod
    async def __anext__(self) -> OutputEvent: ...

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Abort the request in the engine if it has not finished; idempotent."""

    def deliver_to(self, sink: Callable[[OutputEvent], bool], plain: PlainSink | None = None) -> bool:
        """Offer events to ``sink`` as they are made, from the engine's own callback (a socket read, a step)
        while the consumer waits in ``__anext__`` with nothing queued: saves a task wake-up per event. An event
        ``sink`` returns False for, or one made while the consumer is busy, is queued for ``__anext__``
        instead, in order; errors and the end always come from ``__anext__``. Returns whether this stream
        delivers so (the default: it does not, and ``sink`` is never called).

        ``plain``: a stream of forwarded frames may offer, instead of ``sink(event)``, the most common event
        without making it: one token as one forwarded frame (``OutputEvent("", 1, prompt_tokens,
        output_tokens, wire_frames=frames)``) as ``plain(frames, prompt_tokens, output_tokens)``, which
        must do exactly what ``sink`` does with that event. Streams that never do may ignore it."""
        return False


@dataclass(frozen=True, slots=True)
class ModelCard:
    """One entry of ``GET /v1/models``."""

    id: str
    owned_by: str = "loadlens"
    max_model_len: int | None = None
    parent: str | None = None
    root: str | None = None


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    detail: str = ""


class Engine(abc.ABC):
    """What the serving layer drives. Implementations: sim (default) and openai (the proxy)."""

    name: str
    """Short engine name, used as the ``gen_ai.provider.name`` and log field."""

    supports_responses_api: bool = True
    """Whether the HTTP layer may run ``POST /v1/responses`` on this engine as a chat generation. False for an
    engine that forwards chat and completions verbatim to a server of its own (the proxy): it cannot translate
    the Responses API, and the route answers 501."""

    forwards_upstream_errors: bool = False
    """Whether the generation and LoRA routes may answer with another server's own status and error body,
    forwarded unchanged (the proxy): the OpenAPI document then admits any status on them."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Start background work (scheduler loop, connection pool). Called once before serving."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Abort everything in flight and release resources."""

    @abc.abstractmethod
    async def generate(self, request: GenerationRequest) -> RequestStream:
        """Admit a request. Raises :class:`EngineError` before any output when it cannot be served."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Abort a request by id (no-op if unknown or finished)."""

    @abc.abstractmethod
    async def models(self) -> list[ModelCard]:
        """The base model and every loaded adapter."""

    @abc.abstractmethod
    async def load_adapter(self, lora: LoRARequest) -> None:
        """Register an adapter. Raises EngineError (INVALID_REQUEST if it exists or is malformed)."""

    @abc.abstractmethod
    async def unload_adapter(self, lora_name: str) -> None:
        """Forget an adapter. Raises EngineError(NOT_FOUND) if unknown."""

    @abc.abstractmethod
    def knobs(self) -> dict[str, Any]:
        """Current runtime knobs (batching window, max_num_seqs, ...); empty if the engine has none."""

    @abc.abstractmethod
    async def set_knobs(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply knob changes atomically (all or none). Raises EngineError(INVALID_REQUEST) naming the
        offending knob. Returns the knobs after the change."""

    @abc.abstractmethod
    async def health(self) -> Health: ...

    def device_state(self, since_us: int = 0) -> Mapping[str, Any] | None:
        """The simulated device-state document (docs/device-state.md), or None when the engine has no
        simulated device (real engines: the GPU exporter reads NVML instead)."""
        return None

    def max_model_len(self) -> int | None:
        """The context length, when known (for validation and token buckets)."""
        return None
