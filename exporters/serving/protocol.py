"""OpenAI request bodies: parsing and validation with field-precise 400 errors.

Validation is strict about types (a string where an integer belongs is a 400, not a silent coercion) and
lenient about unknown fields, which are kept in the body so a proxy can forward them, as vLLM ignores them.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from exporters.serving.engine import Endpoint, SamplingParams

MAX_TOKENS_LIMIT = 2**31 - 1
"""Anything above int32 is a client bug; the context check catches smaller absurd values."""

_DATA_URL = re.compile(r"^data:(?P<mime>image/[a-zA-Z0-9.+-]+)(?:;[^,;]*)*;base64,(?P<data>.*)$", re.DOTALL)


class RequestError(ValueError):
    """An invalid request; becomes HTTP 400 with ``param`` naming the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


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


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RequestError(f"Request body is not valid JSON: {err}") from err
    if not isinstance(doc, dict):
        raise RequestError("Request body must be a JSON object")
    return doc


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _opt_int(body: dict[str, Any], key: str, *, lo: int, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v):
        raise RequestError(f"'{key}' must be an integer, got {type(v).__name__}", key)
    if not lo <= v <= hi:
        raise RequestError(f"'{key}' must be between {lo} and {hi}, got {v}", key)
    return int(v)


def _opt_float(body: dict[str, Any], key: str, default: float, *, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    if not _is_num(v):
        raise RequestError(f"'{key}' must be a number, got {type(v).__name__}", key)
    if v < lo or v > hi or (lo_open and v == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise RequestError(f"'{key}' must be in {bound}, got {v}", key)
    return float(v)


def _opt_bool(body: dict[str, Any], key: str, default: bool, *, where: str | None = None) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(f"'{where or key}' must be a boolean, got {type(v).__name__}", where or key)
    return v


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return tuple(s for s in v if s)
    raise RequestError("'stop' must be a string or a list of strings", "stop")


def _check_image_url(url: Any, param: str) -> None:
    if not isinstance(url, str) or not url:
        raise RequestError("image_url.url must be a non-empty string", param)
    if url.startswith("data:"):
        m = _DATA_URL.match(url)
        if m is None:
            raise RequestError("image data URL must look like data:image/<type>;base64,<data>", param)
        try:
            base64.b64decode(m.group("data"), validate=True)
        except (binascii.Error, ValueError) as err:
            raise RequestError(f"image data URL is not valid base64: {err}", param) from err
    elif not url.startswith(("http://", "https://")):
        raise RequestError("image_url.url must be a data: URL or an http(s) URL", param)


def _render_messages(messages: Any) -> tuple[str, int]:
    """Flatten chat messages to prompt text with a minimal template; count image parts."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", "messages")
    parts: list[str] = []
    images = 0
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(f"{where} must be an object", "messages")
        role = msg.get("role")
        if role not in {"system", "user", "assistant", "tool", "developer"}:
            raise RequestError(f"{where}.role must be one of system, user, assistant, tool, developer", "messages")
        content = msg.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, str):
            parts.append(f"<|{role}|>{content}")
            continue
        if not isinstance(content, list):
            raise RequestError(f"{where}.content must be a string or a list of content parts", "messages")
        texts: list[str] = []
        for j, part in enumerate(content):
            pwhere = f"{where}.content[{j}]"
            if not isinstance(part, dict):
                raise RequestError(f"{pwhere} must be an object", "messages")
            kind = part.get("type")
            if kind == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise RequestError(f"{pwhere}.text must be a string", "messages")
                texts.append(text)
            elif kind == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, dict) else image
                _check_image_url(url, "messages")
                images += 1
            else:
                raise RequestError(f"{pwhere}.type {kind!r} is not supported (text, image_url)", "messages")
        parts.append(f"<|{role}|>" + "\n".join(texts))
    parts.append("<|assistant|>")
    return "\n".join(parts), images


def _prompt(body: dict[str, Any]) -> str:
    v = body.get("prompt")
    if isinstance(v, str):
        return v
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        return v[0]
    if isinstance(v, list) and len(v) != 1 and all(isinstance(s, str) for s in v):
        raise RequestError("batched prompts are not supported; send one prompt per request", "prompt")
    raise RequestError("'prompt' must be a string", "prompt")


def parse_request(endpoint: Literal["chat", "completions"], body: dict[str, Any]) -> ParsedRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", "model")
    if endpoint == "chat":
        prompt, images = _render_messages(body.get("messages"))
    else:
        prompt, images = _prompt(body), 0

    n = _opt_int(body, "n", lo=1, hi=MAX_TOKENS_LIMIT)
    if n is not None and n != 1:
        raise RequestError(f"only n=1 is supported, got n={n}", "n")
    max_tokens = _opt_int(body, "max_tokens", lo=1, hi=MAX_TOKENS_LIMIT)
    if endpoint == "chat":
        mct = _opt_int(body, "max_completion_tokens", lo=1, hi=MAX_TOKENS_LIMIT)
        max_tokens = mct if mct is not None else max_tokens
    if max_tokens is None:
        # OpenAI's legacy completions default is 16; chat defaults to "as much as fits", resolved by the engine.
        max_tokens = 16 if endpoint == "completions" else 0

    stream = _opt_bool(body, "stream", False)
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not stream:
            raise RequestError("Stream options can only be defined when `stream=True`.", "stream_options")
        if not isinstance(options, dict):
            raise RequestError("'stream_options' must be an object", "stream_options")
        include_usage = _opt_bool(options, "include_usage", False, where="stream_options.include_usage")
        continuous = _opt_bool(options, "continuous_usage_stats", False, where="stream_options.continuous_usage_stats")

    priority = body.get("priority", 0)
    if not _is_int(priority) or not -(2**63) <= priority < 2**63:
        raise RequestError("'priority' must be a 64-bit integer", "priority")

    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise RequestError("'seed' must be an integer", "seed")

    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=_opt_float(body, "temperature", 1.0, lo=0.0, hi=2.0),
        top_p=_opt_float(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),
        seed=seed,
        stop=_stop(body),
        ignore_eos=_opt_bool(body, "ignore_eos", False),
    )
    return ParsedRequest(
        endpoint=endpoint,
        model=model,
        prompt=prompt,
        image_count=images,
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        continuous_usage_stats=continuous,
        priority=int(priority),
        body=body,
    )


@dataclass(frozen=True, slots=True)
class LoadAdapterBody:
    lora_name: str
    lora_path: str


def parse_load_adapter(body: dict[str, Any]) -> LoadAdapterBody:
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not name.strip():
        raise RequestError("'lora_name' must be a non-empty string", "lora_name")
    if not isinstance(path, str) or not path.strip():
        raise RequestError("'lora_path' must be a non-empty string", "lora_path")
    if len(name) > 256 or any(c in name for c in "\n\r\t,"):
        raise RequestError(
            "'lora_name' must be at most 256 characters without commas or control characters", "lora_name"
        )
    return LoadAdapterBody(lora_name=name, lora_path=path)


def parse_unload_adapter(body: dict[str, Any]) -> str:
    name = body.get("lora_name")
    if not isinstance(name, str) or not name.strip():
        raise RequestError("'lora_name' must be a non-empty string", "lora_name")
    return name
