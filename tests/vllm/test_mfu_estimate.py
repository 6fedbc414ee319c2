"""The proxy's MFU estimate against vLLM's own: the session vLLM runs with ``--enable-mfu-metrics`` and the
session proxy with ``--enable-mfu-metrics --model-config <the tiny model's directory>``. Requests are sent one
at a time through the proxy, with prompts that share no prefix-cache block, so vLLM runs exactly the steps the
proxy assumes (one prefill, one decode per further token, no batching); the increase of each of the three
counters must agree (figures and the known differences in docs/serving.md).

FLOPs and bytes written agree exactly. vLLM's bytes read are higher by whole steps' weight reads: it estimates
every step it records, and a step that computes no token still reads the weights in its model (measured: one
such step per request here, 8 × 986,624 B); the proxy bills only steps that compute tokens."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadlens.contracts import mfu, model_config
from tests.support.vllm_model import SERVED_NAME
from tests.vllm.conftest import Proxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NAMES = ("flops", "read_bytes", "write_bytes")
REQUESTS = 8
TOLERANCE = 1e-6
"""Relative: vLLM rounds each component of each step down to an integer; the proxy sums in floats."""


def counters(url: str) -> tuple[float, ...]:
    """The three counters of ``SERVED_NAME`` at ``url``'s /metrics."""
    values = dict.fromkeys(NAMES, 0.0)
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in family.samples:
            for n in NAMES:
                if s.name == f"vllm:estimated_{n}_per_gpu_total" and s.labels.get("model_name") == SERVED_NAME:
                    values[n] += s.value
    return tuple(values.values())


def body(i: int) -> dict[str, object]:
    # A distinct first word: no 16-token block of one prompt is a prefix of another's, so vLLM's prefix cache
    # has no hit (a hit would shrink vLLM's prefill, which a streamed answer does not report).
    words = " ".join(f"{chr(97 + i)}{j}" for j in range(6 + 11 * (i % 8)))
    return {"model": SERVED_NAME, "prompt": words, "max_tokens": 4 + 3 * (i % 8), "temperature": 0,
            "ignore_eos": True, "stream": i % 2 == 0}  # fmt: skip


def send(proxy: Proxy, i: int) -> None:
    r = httpx.post(proxy.url + "/v1/completions", json=body(i), timeout=60)
    assert r.status_code == 200, r.text


def usage(proxy: Proxy, i: int) -> tuple[int, int]:
    """(prompt, completion tokens) of request ``i``, from vLLM's tokenizer (/tokenize) and its max_tokens."""
    b = body(i)
    r = httpx.post(proxy.upstream.url + "/tokenize", json={"model": SERVED_NAME, "prompt": b["prompt"]}, timeout=30)
    return int(r.json()["count"]), int(str(b["max_tokens"]))


def test_the_proxys_estimate_matches_vllms_counters(vllm_proxy: Proxy) -> None:
    vllm_url = vllm_proxy.upstream.url
    vllm_before, proxy_before = counters(vllm_url), counters(vllm_proxy.url)
    for i in range(REQUESTS):
        send(vllm_proxy, i)
    vllm_delta = [a - b for a, b in zip(counters(vllm_url), vllm_before, strict=True)]
    proxy_delta = [a - b for a, b in zip(counters(vllm_proxy.url), proxy_before, strict=True)]
    ratio = [p / v for p, v in zip(proxy_delta, vllm_delta, strict=True)]
    print(f"\nvLLM {vllm_delta}\nproxy {proxy_delta}\nratio {ratio}")
    assert all(v > 0 for v in vllm_delta)
    flops, read, written = 0, 1, 2
    assert [proxy_delta[flops], proxy_delta[written]] == pytest.approx(
        [vllm_delta[flops], vllm_delta[written]], rel=TOLERANCE
    )
    weights = mfu.weight_read_bytes(mfu.shape(model_config.resolve(str(vllm_proxy.upstream.model.path))))
    empty_steps = (vllm_delta[read] - proxy_delta[read]) / weights
    assert empty_steps == pytest.approx(round(empty_steps), abs=1e-6)  # whole steps' weights, nothing else
    assert 0 <= round(empty_steps) <= REQUESTS


def test_batched_requests_flops_and_writes_still_match(vllm_proxy: Proxy) -> None:
    """The same requests sent all at once: vLLM batches them, which changes only how often the weights are
    read, so FLOPs and bytes written still agree exactly; the proxy's bytes read (weights shared by the
    time-weighted number of requests in flight) lie between its per-token part and the requests' solo sum."""
    vllm_url = vllm_proxy.upstream.url
    vllm_before, proxy_before = counters(vllm_url), counters(vllm_proxy.url)
    with ThreadPoolExecutor(REQUESTS) as pool:
        list(pool.map(lambda i: send(vllm_proxy, i + REQUESTS), range(REQUESTS)))
    vllm_delta = [a - b for a, b in zip(counters(vllm_url), vllm_before, strict=True)]
    proxy_delta = [a - b for a, b in zip(counters(vllm_proxy.url), proxy_before, strict=True)]
    ratio = [p / v for p, v in zip(proxy_delta, vllm_delta, strict=True)]
    print(f"\nbatched: vLLM {vllm_delta}\nproxy {proxy_delta}\nratio {ratio}")
    assert [proxy_delta[0], proxy_delta[2]] == pytest.approx([vllm_delta[0], vllm_delta[2]], rel=TOLERANCE)
    shape = mfu.shape(model_config.resolve(str(vllm_proxy.upstream.model.path)))
    works = [mfu.request_work(*usage(vllm_proxy, i + REQUESTS)) for i in range(REQUESTS)]
    solo = sum(mfu.estimate(shape, w).read_bytes for w in works)
    weights = sum(w.steps for w in works) * mfu.weight_read_bytes(shape)
    assert solo - weights <= proxy_delta[1] <= solo
