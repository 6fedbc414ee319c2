"""``loadlens serve --engine openai --upstream-kind auto`` in front of a real vLLM. The client gets vLLM's
bytes: a stream or a non-streamed answer through the proxy is compared with what vLLM sent for that very
request (a recording relay sits between them), byte for byte; errors with the same request sent to vLLM
directly, greedy (temperature 0), so both are the same generation. The one change the proxy makes (a usage
chunk it asked for on a client's behalf) is asserted exactly, so a change on either side shows here."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.support import vllm_server as rig
from tests.support.vllm_model import SERVED_NAME
from tests.vllm.conftest import Proxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

CHAT = {
    "model": SERVED_NAME,
    "messages": [{"role": "user", "content": "Write a haiku about load tests."}],
    "max_tokens": 12,
    "temperature": 0,
    "ignore_eos": True,
}
COMPLETION = {
    "model": SERVED_NAME,
    "prompt": "The quick brown fox",
    "max_tokens": 12,
    "temperature": 0,
    "ignore_eos": True,
}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
BODIES = {"chat": CHAT, "completions": COMPLETION}

FINGERPRINT = rb',"system_fingerprint":"[^"]*"'


def stream(base_url: str, endpoint: str, body: dict[str, Any]) -> tuple[int, list[bytes]]:
    """The status and the stream's non-empty lines."""
    with httpx.stream("POST", base_url + PATHS[endpoint], json=body, timeout=60) as resp:
        raw = b"".join(resp.iter_bytes())
    return resp.status_code, [line for line in raw.split(b"\n") if line]


def post(base_url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(base_url + path, json=body, timeout=60)


def differences(vllm: Any, proxy: Any, path: str = "") -> set[str]:
    """Where ``proxy`` differs from ``vllm``, by JSON path; the values of ``id`` and ``created`` are skipped."""
    if isinstance(vllm, dict) and isinstance(proxy, dict):
        out: set[str] = set()
        for key in vllm.keys() | proxy.keys():
            sub = f"{path}.{key}" if path else key
            if key not in proxy:
                out.add(f"only vLLM: {sub}")
            elif key not in vllm:
                out.add(f"only proxy: {sub}")
            elif key not in ("id", "created") or path:
                out |= differences(vllm[key], proxy[key], sub)
        return out
    if isinstance(vllm, list) and isinstance(proxy, list) and len(vllm) == len(proxy):
        return set().union(
            *(differences(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(vllm, proxy, strict=True)))
        )
    return set() if vllm == proxy else {f"value: {path} {vllm!r} != {proxy!r}"}


def test_auto_detects_vllm(vllm_proxy: Proxy) -> None:
    metrics = httpx.get(vllm_proxy.url + "/metrics", timeout=10).text
    assert [line for line in metrics.splitlines() if line.startswith("loadlens_proxy_upstream_info")] == [
        'loadlens_proxy_upstream_info{upstream_kind="vllm"} 1.0'
    ]


@pytest.mark.parametrize(
    "endpoint,options",
    [
        ("chat", {"include_usage": True}),
        ("chat", None),
        ("completions", {"include_usage": True}),
        ("completions", {"include_usage": True, "continuous_usage_stats": True}),
        ("completions", None),
    ],
)
def test_streams_are_vllms_bytes(vllm_proxy: Proxy, endpoint: str, options: dict[str, bool] | None) -> None:
    """The client's data lines are the very lines vLLM wrote for the forwarded request (recorded between the
    proxy and vLLM), byte for byte and chunk for chunk, but for the usage chunk the proxy asked vLLM for on
    behalf of a client that did not: that client gets the finishing chunk with the usage chunk's
    system_fingerprint last, where vLLM writes it when no usage was asked for."""
    body: dict[str, Any] = {**BODIES[endpoint], "stream": True}
    if options is not None:
        body["stream_options"] = options
    vllm_proxy.relay.clear()
    status, lines = stream(vllm_proxy.url, endpoint, body)
    upstream = vllm_proxy.relay.sse_data_lines()
    assert status == 200
    *generated, usage, done = upstream
    assert done == b"data: [DONE]"
    assert b'"choices":[],"usage":{' in usage
    assert b'"completion_tokens":12}' in usage
    if options:
        assert lines == upstream
    else:
        fingerprint = re.search(FINGERPRINT, usage)
        assert fingerprint is not None and re.search(FINGERPRINT, generated[-1]) is None
        assert lines == [*generated[:-1], generated[-1][:-1] + fingerprint.group(0) + b"}", done]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_client_that_asks_for_no_usage_gets_vllms_fingerprint_where_vllm_puts_it(
    vllm_proxy: Proxy, endpoint: str
) -> None:
    """vLLM writes its system_fingerprint on a stream's last chunk: the usage chunk when the client asked for
    usage, else the finishing chunk. Through the proxy (which always asks vLLM for usage) a client that asked
    for none gets the finishing chunk with the same fields in the same order as from vLLM directly."""
    body: dict[str, Any] = {**BODIES[endpoint], "stream": True}
    direct = stream(vllm_proxy.upstream.url, endpoint, body)[1]
    proxied = stream(vllm_proxy.url, endpoint, body)[1]
    assert [bool(re.search(FINGERPRINT, line)) for line in direct[-2:]] == [True, False]
    assert [bool(re.search(FINGERPRINT, line)) for line in proxied[-2:]] == [True, False]
    mine, theirs = json.loads(proxied[-2][6:]), json.loads(direct[-2][6:])
    assert list(mine) == list(theirs)
    assert (mine["system_fingerprint"], mine["choices"][0]["finish_reason"]) == (
        theirs["system_fingerprint"],
        theirs["choices"][0]["finish_reason"],
    )


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_non_streamed_answers_are_vllms_bytes(vllm_proxy: Proxy, endpoint: str) -> None:
    """A non-streamed request goes on to vLLM as it came and its answer comes back whole: the client's body is
    the very body vLLM sent for the forwarded request (recorded between them), with vLLM's content type; the
    same request sent directly gets the same answer but for its own id and creation time."""
    direct = post(vllm_proxy.upstream.url, PATHS[endpoint], BODIES[endpoint])
    vllm_proxy.relay.clear()
    proxied = post(vllm_proxy.url, PATHS[endpoint], BODIES[endpoint])
    assert direct.status_code == proxied.status_code == 200
    assert vllm_proxy.relay.bodies() == [proxied.content]
    assert proxied.headers["content-type"] == direct.headers["content-type"] == "application/json"
    assert direct.json()["usage"]["completion_tokens"] == 12
    assert differences(direct.json(), proxied.json()) == set()
    assert b'"system_fingerprint":"' in proxied.content


TOO_LONG = {**COMPLETION, "prompt": "ab " * 1100}
ERRORS = {
    "unknown model": ("completions", {**COMPLETION, "model": "no-such-model"}),
    "unknown model, streamed": ("chat", {**CHAT, "model": "no-such-model", "stream": True}),
    "context too long": ("completions", TOO_LONG),
    "max_tokens over the context": ("chat", {**CHAT, "max_tokens": 2000}),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_upstream_errors_are_vllms_status_and_bytes(vllm_proxy: Proxy, case: str) -> None:
    endpoint, body = ERRORS[case]
    direct = post(vllm_proxy.upstream.url, PATHS[endpoint], body)
    proxied = post(vllm_proxy.url, PATHS[endpoint], body)
    assert direct.status_code in (400, 404)
    assert (proxied.status_code, proxied.headers["content-type"], proxied.content) == (
        direct.status_code,
        direct.headers["content-type"],
        direct.content,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_bad_parameter_gets_vllms_own_refusal(vllm_proxy: Proxy, stream: bool) -> None:
    """The proxy leaves value checks to the upstream (``Engine.forwards_upstream_errors``; docs/serving.md,
    *Request validation*): vLLM's status and bytes, its own message."""
    body = {**COMPLETION, "temperature": -1, "stream": stream}
    direct = post(vllm_proxy.upstream.url, PATHS["completions"], body)
    proxied = post(vllm_proxy.url, PATHS["completions"], body)
    assert direct.json()["error"] == {
        "message": "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
        "type": "BadRequestError",
        "param": "temperature",
        "code": 400,
    }
    assert (proxied.status_code, proxied.content) == (direct.status_code, direct.content)


def test_lora_adapters_load_and_serve_through_the_proxy(vllm_proxy: Proxy) -> None:
    """Loaded through the proxy (one by an absolute path, one relative to its --lora-root), listed, used (the
    proxy's answer is vLLM's and differs from the base model's) and unloaded. ``--max-loras 1``: the second
    adapter's request swaps the first out."""
    model = vllm_proxy.upstream.model
    base = post(vllm_proxy.url, PATHS["completions"], COMPLETION).json()["choices"][0]["text"]
    loads = {"r8": str(model.adapters["r8"]), "r32": "r32"}
    for name, path in loads.items():
        resp = post(vllm_proxy.url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        assert (resp.status_code, resp.text) == (200, f"Success: LoRA adapter '{name}' added successfully.")
    cards = httpx.get(vllm_proxy.url + "/v1/models", timeout=10).json()["data"]
    assert [(c["id"], c["parent"]) for c in cards] == [(SERVED_NAME, None), ("r8", SERVED_NAME), ("r32", SERVED_NAME)]
    try:
        for name in loads:
            body = {**COMPLETION, "model": name}
            proxied = post(vllm_proxy.url, PATHS["completions"], body).json()
            direct = post(vllm_proxy.upstream.url, PATHS["completions"], body).json()
            assert proxied["model"] == name
            assert proxied["choices"][0]["text"] == direct["choices"][0]["text"] != base
    finally:
        for name in loads:
            resp = post(vllm_proxy.url, "/v1/unload_lora_adapter", {"lora_name": name})
            assert (resp.status_code, resp.text) == (200, f"Success: LoRA adapter '{name}' removed successfully.")
    gone = post(vllm_proxy.url, PATHS["completions"], {**COMPLETION, "model": "r8"})
    assert gone.status_code == 404


def test_an_adapter_outside_the_lora_root_never_reaches_vllm(vllm_proxy: Proxy, vllm_server: rig.VllmServer) -> None:
    resp = post(vllm_proxy.url, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(vllm_server.model.path)})
    assert (resp.status_code, resp.json()["error"]["param"]) == (400, "lora_path")
    cards = httpx.get(vllm_server.url + "/v1/models", timeout=10).json()["data"]
    assert "x" not in [c["id"] for c in cards]
