"""OpenAI request bodies: pydantic models (validation and the OpenAPI document share one definition) and the
parse step that turns a body into what the engine needs, with field-precise 400 errors.

Validation is as lenient and as strict as vLLM's own, which validates the same fields with pydantic in lax
mode: an integral float or a numeric string where an integer belongs (``"max_tokens": 4.0`` or ``"4"``) is
accepted, ``4.5`` or ``"four"`` is refused; ``seed`` and ``priority`` must fit a signed 64-bit integer; an
empty content-part list is refused. Unknown fields are accepted and kept in the body so a proxy can forward
them (vLLM logs and ignores them). Strings must be valid Unicode: a lone UTF-16 surrogate escape
(``"\\ud800"``) is refused with a 400, as vLLM refuses text its tokenizer cannot encode. Every rule is listed in
docs/serving.md (*Request validation*).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from exporters.serving.engine import Endpoint, SamplingParams

MAX_TOKENS_LIMIT = 2**31 - 1
"""Anything above int32 is a client bug; the context check catches smaller absurd values."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_DATA_URL = re.compile(r"^data:(?P<mime>image/[a-zA-Z0-9.+-]+)(?:;[^,;]*)*;base64,(?P<data>.*)$", re.DOTALL)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
ROLES = ("system", "user", "assistant", "tool", "developer")


class RequestError(ValueError):
    """An invalid request; becomes HTTP 400 with ``param`` naming the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


# --- request models ---------------------------------------------------------------------------------------


class OpenAIModel(BaseModel):
    """Extra fields are allowed, as the OpenAI API and vLLM allow them."""

    model_config = ConfigDict(extra="allow")


class ImageURL(OpenAIModel):
    url: str = Field(description="a data:image/<type>;base64,<data> URL (validated) or an http(s) URL (not fetched)")

    @field_validator("url")
    @classmethod
    def _check(cls, url: str) -> str:
        _check_image_url(url)
        return url


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ImagePart(OpenAIModel):
    type: Literal["image_url"]
    image_url: ImageURL | str

    @field_validator("image_url")
    @classmethod
    def _check(cls, image_url: ImageURL | str) -> ImageURL | str:
        if isinstance(image_url, str):
            _check_image_url(image_url)
        return image_url


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(OpenAIModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | Annotated[list[ContentPart], Field(min_length=1)] | None = Field(
        default=None, description="a string or a non-empty list of parts; may be null (or absent) for assistant"
    )

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content is required for role {self.role!r} (only assistant messages may omit it)")
        return self


class StreamOptions(OpenAIModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


_Float = Annotated[float, Field(allow_inf_nan=False)]


class _GenerationRequest(OpenAIModel):
    model: str | None = Field(default=None, description="base model or a loaded adapter; default the base model")
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    n: int | None = Field(default=1, ge=1, le=1, description="only 1 is supported")
    temperature: _Float | None = Field(default=None, ge=0.0)
    top_p: _Float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = Field(default=None, description="only with stream=true")
    ignore_eos: bool | None = False
    priority: int = Field(
        default=0, ge=INT64_MIN, le=INT64_MAX, description="lower runs first; non-zero needs scheduling_policy=priority"
    )
    # Validated as vLLM's sampling parameters are, then ignored by the sim (the proxy forwards them).
    presence_penalty: _Float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: _Float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: _Float | None = Field(default=None, gt=0.0)
    top_k: int | None = Field(default=None, ge=-1, description="-1 or 0 disable")
    min_p: _Float | None = Field(default=None, ge=0.0, le=1.0)
    user: str | None = None


class ChatCompletionRequest(_GenerationRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS_LIMIT, description="wins over max_tokens"
    )
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0)


class CompletionRequest(_GenerationRequest):
    """``POST /v1/completions``."""

    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] = Field(
        description="one prompt: a string or a list of exactly one string (no batches, no token ids)"
    )
    logprobs: int | None = Field(default=None, ge=0)


class LoadLoRAAdapterRequest(OpenAIModel):
    """``POST /v1/load_lora_adapter``."""

    lora_name: str = Field(min_length=1, max_length=256, pattern=r"^[^\n\r\t,]*$")
    lora_path: str = Field(min_length=1)

    @field_validator("lora_name", "lora_path")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be a non-empty string")
        return v


class UnloadLoRAAdapterRequest(OpenAIModel):
    """``POST /v1/unload_lora_adapter``."""

    lora_name: str = Field(min_length=1)

    @field_validator("lora_name")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be a non-empty string")
        return v


# --- parsing ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: Endpoint
    model: str | None
    prompt: str
    image_count: int
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage_stats: bool
    priority: int
    body: dict[str, Any]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
"""What ``json.loads(raw, parse_constant=_no_constant)`` builds, scanner and all, on every call: made once."""


def _loads(raw: bytes) -> Any:
    """``json.loads(raw, parse_constant=_no_constant)`` for bytes (decoded as it decodes them), with one decoder."""
    if not isinstance(raw, bytes | bytearray):
        return json.loads(raw, parse_constant=_no_constant)
    return _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))


def _lone_surrogate_at(value: Any, where: str) -> str | None:
    """The path of the first string (key or value) holding a lone surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            inner = f"{where}.{k}" if where else k
            if _lone_surrogate_at(k, inner) is not None:
                return f"{where or 'body'} (a key)"
            found = _lone_surrogate_at(v, inner)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _lone_surrogate_at(v, f"{where}[{i}]")
            if found is not None:
                return found
    return None


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        doc = _loads(raw)
    except (UnicodeDecodeError, ValueError) as err:
        raise RequestError(f"Request body is not valid JSON: {err}") from err
    if not isinstance(doc, dict):
        raise RequestError("Request body must be a JSON object")
    # Only a \uD800-\uDFFF escape can make a lone surrogate (raw bytes were valid UTF-8): walk only then.
    if _SURROGATE_ESCAPE.search(raw):
        where = _lone_surrogate_at(doc, "")
        if where is not None:
            top = re.split(r"[.\[ ]", where, maxsplit=1)[0]
            param = None if top == "body" else top
            raise RequestError(
                f"{where}: string contains a lone UTF-16 surrogate escape (\\ud800-\\udfff without "
                "its pair), which is not valid Unicode text",
                param,
            )
    return doc


_UNION_TAGS = frozenset({"str", "none", "int", "float", "bool", "ImageURL"})
_TYPE_MISMATCH = frozenset({"string_type", "none_required", "list_type", "model_type", "model_attributes_type"})


def _loc(loc: tuple[int | str, ...]) -> str:
    """``messages[0].content[1].text`` from pydantic's location, without the union member tags it adds."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _UNION_TAGS or "[" in part:
            continue
        else:
            out += f".{part}" if out else part
    return out


def _validation_error(err: ValidationError) -> RequestError:
    # Of a union's alternatives, report the one that got furthest (deepest location, not a mere type mismatch).
    errors = err.errors(include_url=False)
    first = max(errors, key=lambda e: (len(e.get("loc", ())), e.get("type") not in _TYPE_MISMATCH))
    loc = tuple(first.get("loc", ()))
    param = str(loc[0]) if loc else None
    where = _loc(loc)
    message = first.get("msg", "invalid value")
    ctx_error = (first.get("ctx") or {}).get("error")
    if isinstance(ctx_error, ValueError):
        message = str(ctx_error)
    return RequestError(f"{where}: {message}" if where else message, param)


def _check_image_url(url: str) -> None:
    if not url:
        raise ValueError("image_url.url must be a non-empty string")
    if url.startswith("data:"):
        m = _DATA_URL.match(url)
        if m is None:
            raise ValueError("image data URL must look like data:image/<type>;base64,<data>")
        try:
            base64.b64decode(m.group("data"), validate=True)
        except (binascii.Error, ValueError) as err:
            raise ValueError(f"image data URL is not valid base64: {err}") from err
    elif not url.startswith(("http://", "https://")):
        raise ValueError("image_url.url must be a data: URL or an http(s) URL")


def _render_messages(messages: list[ChatMessage]) -> tuple[str, int]:
    """Flatten chat messages to prompt text with a minimal template; count image parts."""
    parts: list[str] = []
    images = 0
    for msg in messages:
        content = msg.content
        if content is None or isinstance(content, str):
            parts.append(f"<|{msg.role}|>{content or ''}")
            continue
        texts: list[str] = []
        for part in content:
            if isinstance(part, TextPart):
                texts.append(part.text)
            else:
                images += 1
        parts.append(f"<|{msg.role}|>" + "\n".join(texts))
    parts.append("<|assistant|>")
    return "\n".join(parts), images


def _stop(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    return tuple(s for s in stop if s)


def parse_request(endpoint: Literal["chat", "completions"], body: dict[str, Any]) -> ParsedRequest:
    req: ChatCompletionRequest | CompletionRequest
    try:
        if endpoint == "chat":
            req = ChatCompletionRequest.model_validate(body)
        else:
            req = CompletionRequest.model_validate(body)
    except ValidationError as err:
        prompt = body.get("prompt")
        batched = isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(s, str) for s in prompt)
        if endpoint == "completions" and batched:
            raise RequestError("batched prompts are not supported; send one prompt per request", "prompt") from None
        raise _validation_error(err) from None

    if isinstance(req, ChatCompletionRequest):
        prompt_text, images = _render_messages(req.messages)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    else:
        prompt_text = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
        images = 0
        max_tokens = req.max_tokens
    if max_tokens is None:
        # OpenAI's legacy completions default is 16; chat defaults to "as much as fits", resolved by the engine.
        max_tokens = 16 if endpoint == "completions" else 0

    stream = bool(req.stream)
    include_usage = continuous = False
    if req.stream_options is not None:
        if not stream:
            raise RequestError("Stream options can only be defined when `stream=True`.", "stream_options")
        include_usage = bool(req.stream_options.include_usage)
        continuous = bool(req.stream_options.continuous_usage_stats)

    temperature = 1.0 if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    assert math.isfinite(temperature) and math.isfinite(top_p)
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=req.seed,
        stop=_stop(req.stop),
        ignore_eos=bool(req.ignore_eos),
    )
    return ParsedRequest(
        endpoint=endpoint,
        model=req.model,
        prompt=prompt_text,
        image_count=images,
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        continuous_usage_stats=continuous,
        priority=req.priority,
        body=body,
    )


class _ForwardedHead(OpenAIModel):
    """What a forwarding engine's HTTP layer reads itself: the served name (adapter routing, metrics label)
    and whether the client streams (how the request is forwarded)."""

    model: str | None = None
    stream: bool | None = False


class _ForwardedStream(OpenAIModel):
    stream_options: StreamOptions | None = None


_INT64 = TypeAdapter(Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)])
_TOKENS = TypeAdapter(Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)])
_FINITE = TypeAdapter(_Float)


def _lenient(adapter: TypeAdapter[Any], value: Any) -> Any:
    """``value`` as ``adapter`` reads it, None when absent or invalid (the upstream judges it)."""
    if value is None:
        return None
    try:
        return adapter.validate_python(value)
    except ValidationError:
        return None


def parse_forwarded_request(endpoint: Endpoint, body: dict[str, Any]) -> ParsedRequest:
    """A body for an engine that forwards it to a server of its own and that server's errors to the client
    (``Engine.forwards_upstream_errors``, the proxy): only what the HTTP layer needs itself is checked, so the
    client gets the upstream's own answer to everything else (a bad ``temperature`` gets vLLM's message).

    Refused here (400): ``messages`` (chat) or ``prompt`` (completions) missing; ``model`` not a string;
    ``stream`` not a boolean; with ``stream`` true, ``stream_options`` not an object of boolean flags (the
    proxy adds ``include_usage`` to it). Read leniently, for span attributes and the priority class only
    (absent or invalid: the defaults, and the upstream refuses them): ``max_tokens`` /
    ``max_completion_tokens``, ``temperature``, ``seed``, ``priority``."""
    required = "messages" if endpoint == "chat" else "prompt"
    if required not in body:
        raise RequestError(f"{required}: Field required", required)
    try:
        head = _ForwardedHead.model_validate({k: body[k] for k in ("model", "stream") if k in body})
        stream = bool(head.stream)
        options = None
        if stream and "stream_options" in body:
            options = _ForwardedStream.model_validate({"stream_options": body["stream_options"]}).stream_options
    except ValidationError as err:
        raise _validation_error(err) from None
    max_tokens = _lenient(_TOKENS, body.get("max_completion_tokens")) if endpoint == "chat" else None
    if max_tokens is None:
        max_tokens = _lenient(_TOKENS, body.get("max_tokens"))
    temperature = _lenient(_FINITE, body.get("temperature"))
    sampling = SamplingParams(
        max_tokens=max_tokens or 0,
        temperature=1.0 if temperature is None else temperature,
        seed=_lenient(_INT64, body.get("seed")),
    )
    return ParsedRequest(
        endpoint=endpoint,
        model=head.model,
        prompt="",  # the upstream renders the prompt
        image_count=0,
        sampling=sampling,
        stream=stream,
        include_usage=bool(options is not None and options.include_usage),
        continuous_usage_stats=bool(options is not None and options.continuous_usage_stats),
        priority=_lenient(_INT64, body.get("priority")) or 0,
        body=body,
    )


def parse_generation(
    endpoint: Literal["chat", "completions"], body: dict[str, Any], *, forwarded: bool
) -> ParsedRequest:
    """The one entry for a generation body: fully validated (:func:`parse_request`), or, for an engine that
    forwards the body and the upstream's errors (``forwarded``), only what the HTTP layer needs
    (:func:`parse_forwarded_request`)."""
    return parse_forwarded_request(endpoint, body) if forwarded else parse_request(endpoint, body)


@dataclass(frozen=True, slots=True)
class LoadAdapterBody:
    lora_name: str
    lora_path: str


def parse_load_adapter(body: dict[str, Any]) -> LoadAdapterBody:
    try:
        req = LoadLoRAAdapterRequest.model_validate(body)
    except ValidationError as err:
        raise _validation_error(err) from None
    return LoadAdapterBody(lora_name=req.lora_name, lora_path=req.lora_path)


def parse_unload_adapter(body: dict[str, Any]) -> str:
    try:
        return UnloadLoRAAdapterRequest.model_validate(body).lora_name
    except ValidationError as err:
        raise _validation_error(err) from None
