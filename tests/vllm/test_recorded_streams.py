"""The recorded vLLM streams (tests/fixtures/upstream_streams/vllm_*) against the real vLLM: each fixture's request
(endpoint, ``stream_options``) is sent to the session's vLLM and the two bodies' SHAPES are compared frame by
frame. Texts, ids, ``created``, model names, token counts and timings are the fixtures' own and are not compared.

A frame's kind is ``role`` (chat's first chunk, ``delta.role``), ``content``, ``finish`` (a ``finish_reason``),
``usage`` (``"choices": []``) or ``done`` (``[DONE]``). Consecutive content frames are one group: vLLM may merge
tokens into one chunk, so their count is not compared, only their shapes. A frame's shape is its ``data:``
framing and every JSON key path in order with its value's type (``null`` kept apart), and beside the type:
``object``'s and ``delta.role``'s values, the id's prefix and suffix shape, ``system_fingerprint``'s shape.
With ``continuous_usage_stats`` the ``usage`` keys on every chunk are part of those shapes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import httpx
import pytest

from tests.fixtures.upstream_streams import NAMES, load
from tests.support import vllm_server as rig

VLLM_NAMES = tuple(n for n in NAMES if n.startswith("vllm_"))
MAX_TOKENS = 6
"""Enough that some content chunk precedes the finish chunk, whatever bytes the tiny model's tokens decode to."""

KEPT: dict[str, dict[str, str]] = {}
"""Differences between a fixture and vLLM 0.32 kept on purpose: fixture name -> {difference: why}. The test
fails on a difference not listed and on a listed one that no longer shows. None is kept: every fixture was
brought to 0.32's shape by this test."""

Shape = tuple[str, ...]


def frames(body: bytes) -> list[bytes]:
    """The SSE frames of a body (each ends with its blank line); every byte must belong to one."""
    out = re.findall(rb".*?\n\n", body, re.S)
    assert b"".join(out) == body, f"a body that is not whole SSE frames: {body[-200:]!r}"
    return out


def _id_shape(value: str) -> str:
    prefix, _, rest = value.rpartition("-")
    return f"{prefix}-<{len(rest)} hex>" if re.fullmatch(r"[0-9a-f]+", rest) else f"<not prefix-hex: {value!r}>"


def _fingerprint_shape(value: str) -> str:
    match = re.fullmatch(r"vllm-\d+\.\d+\.\d+-([0-9a-f]+)", value)
    return f"vllm-<version>-<{len(match.group(1))} hex>" if match else f"<other: {value!r}>"


def _tag(path: str, value: Any) -> str:
    if value is None:
        return "null"
    if path == "id":
        return "id " + _id_shape(value)
    if path in ("object", "choices[].delta.role"):
        return f"{type(value).__name__} {value!r}"
    if path == "system_fingerprint" and isinstance(value, str):
        return "str " + _fingerprint_shape(value)
    if isinstance(value, list | dict) and not value:
        return "empty " + type(value).__name__
    return type(value).__name__


def _walk(value: Any, path: str) -> Iterable[str]:
    yield f"{path or '.'} = {_tag(path, value)}"
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item, f"{path}[]")


def kind_and_shape(frame: bytes) -> tuple[str, Shape]:
    line, sep, rest = frame.partition(b"\n")
    framing = f"framing {line[: line.index(b':') + 2]!r}+payload{sep!r}{rest!r}"
    payload = line.split(b":", 1)[1].strip()
    if payload == b"[DONE]":
        return "done", (framing,)
    chunk = json.loads(payload)
    choices = chunk.get("choices")
    if choices == []:
        kind = "usage"
    elif "role" in choices[0].get("delta", {}):
        kind = "role"
    elif choices[0].get("finish_reason") is not None:
        kind = "finish"
    else:
        kind = "content"
    return kind, (framing, *_walk(chunk, ""))


def groups(body: bytes) -> list[tuple[str, list[Shape]]]:
    """The body's frame kinds in order, consecutive frames of one kind as one group with its distinct shapes."""
    out: list[tuple[str, list[Shape]]] = []
    for frame in frames(body):
        kind, shape = kind_and_shape(frame)
        if not out or out[-1][0] != kind:
            out.append((kind, []))
        if shape not in out[-1][1]:
            out[-1][1].append(shape)
    return out


def _shape_differences(kind: str, recorded: Shape, live: Shape) -> list[str]:
    only_recorded = [e for e in recorded if e not in live]
    only_live = [e for e in live if e not in recorded]
    out = [f"{kind}: only the fixture has {e}" for e in only_recorded]
    out += [f"{kind}: only vLLM has {e}" for e in only_live]
    if not out and recorded != live:
        out.append(f"{kind}: the same entries in another order: fixture {list(recorded)}, vLLM {list(live)}")
    return out


def differences(recorded: bytes, live: bytes) -> list[str]:
    """Every shape difference between a recorded body and a live one, as sorted one-line descriptions."""
    rec, liv = groups(recorded), groups(live)
    rec_kinds, live_kinds = [k for k, _ in rec], [k for k, _ in liv]
    if rec_kinds != live_kinds:
        return [f"frame kinds: fixture {rec_kinds}, vLLM {live_kinds}"]
    out: list[str] = []
    for (kind, rec_shapes), (_, live_shapes) in zip(rec, liv, strict=True):
        if len(rec_shapes) == 1 and len(live_shapes) == 1:
            out += _shape_differences(kind, rec_shapes[0], live_shapes[0])
        elif sorted(rec_shapes) != sorted(live_shapes):
            out.append(f"{kind}: fixture shapes {rec_shapes}, vLLM shapes {live_shapes}")
    return sorted(out)


def _request(name: str, served_name: str) -> tuple[str, dict[str, Any]]:
    fixture = load(name)
    body: dict[str, Any] = {"model": served_name, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}
    if fixture.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "What colour is the sky?"}]
    else:
        body["prompt"] = "The sky is"
    if fixture.stream_options:
        body["stream_options"] = fixture.stream_options
    return fixture.path, body


def test_the_comparison_sees_each_kind_of_difference() -> None:
    """The comparer itself, on a fixture against altered copies of it (no vLLM, not slow)."""
    raw = load("vllm_chat_usage").raw
    assert differences(raw, raw) == []
    merged = raw.replace(b'"content":" sky"}', b'"content":" sky is"}')
    assert differences(raw, merged) == []  # content is not compared, nor (below) how many content chunks
    one_fewer = b"".join(f for f in frames(raw) if b'"content":" is"' not in f)
    assert differences(raw, one_fewer) == []
    assert differences(raw, raw.replace(b',"token_ids":null}', b"}")) == [
        "content: only the fixture has choices[].token_ids = null",
        "finish: only the fixture has choices[].token_ids = null",
    ]
    assert differences(raw, raw.replace(b'"stop_reason":null', b'"stop_reason":"x"')) == [
        "finish: only the fixture has choices[].stop_reason = null",
        "finish: only vLLM has choices[].stop_reason = str",
    ]
    assert differences(raw, raw.replace(b"chatcmpl-8d3c0f5e2b7a4f61", b"chatcmpl-8d3c")) == [
        f"{kind}: only {who} has id = id chatcmpl-<{n} hex>"
        for kind in ("content", "finish", "role", "usage")
        for who, n in (("the fixture", 16), ("vLLM", 4))
    ]
    without_done = raw.replace(b"data: [DONE]\n\n", b"")
    assert differences(raw, without_done) == [
        "frame kinds: fixture ['role', 'content', 'finish', 'usage', 'done'], "
        "vLLM ['role', 'content', 'finish', 'usage']"
    ]
    assert differences(raw, raw.replace(b'"object":"chat.completion.chunk"', b'"object":"chunk"')) == [
        f"{kind}: only {who} has object = str {value!r}"
        for kind in ("content", "finish", "role", "usage")
        for who, value in (("the fixture", "chat.completion.chunk"), ("vLLM", "chunk"))
    ]
    reordered = raw.replace(b'"logprobs":null,"finish_reason":null,', b'"finish_reason":null,"logprobs":null,')
    [moved] = differences(raw, reordered)
    assert moved.startswith("content: the same entries in another order: ")


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", VLLM_NAMES)
def test_recorded_stream_has_the_live_shape(name: str, vllm_server: rig.VllmServer) -> None:
    path, body = _request(name, vllm_server.served_name)
    with httpx.Client(base_url=vllm_server.url, timeout=120) as client, client.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200, resp.read()
        live = b"".join(resp.iter_raw())
    kept = KEPT.get(name, {})
    assert differences(load(name).raw, live) == sorted(kept), f"vLLM sent:\n{live.decode(errors='replace')}"


def test_every_kept_difference_names_a_vllm_fixture_and_a_reason() -> None:
    assert set(KEPT) <= set(VLLM_NAMES)
    assert all(reason.strip() for kept in KEPT.values() for reason in kept.values())
    assert len(VLLM_NAMES) == 5
