"""The proxy's MFU estimate (exporters/serving/engines/openai/mfu.py): vLLM's estimated FLOPs/bytes counters
from token counts, the weights shared by the requests in flight; and the sim behind the proxy, whose own
counters (per step) the proxy's (per request) must equal for requests sent one at a time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.openai.engine import OpenAIProxyEngine
from exporters.serving.engines.openai.mfu import ProxyMfu
from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile
from exporters.serving.tracing import Tracing
from loadlens.contracts import mfu, model_config
from tests.support.server import serve_app

NAMES = ("flops", "read_bytes", "write_bytes")
TINY = mfu.shape(model_config.resolve("tiny"))


def _values(registry: CollectorRegistry, model: str) -> tuple[float | None, ...]:
    labels = {"model_name": model, "engine": "0"}
    return tuple(registry.get_sample_value(f"vllm:estimated_{n}_per_gpu_total", labels) for n in NAMES)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_lone_request_is_billed_its_own_steps() -> None:
    clock, reg = Clock(), CollectorRegistry()
    counter = ProxyMfu(TINY, reg, clock=clock)
    ticket = counter.begin()
    clock.now += 2.0
    counter.end(ticket, "m", (100, 20, 36))
    want = mfu.estimate(TINY, mfu.request_work(100, 20, 36))
    assert _values(reg, "m") == (want.flops, want.read_bytes, want.write_bytes)
    # The work: a prefill of the 64 uncached tokens (context 100), then 19 decodes (contexts 101..119), 20 steps.
    work = mfu.request_work(100, 20, 36)
    assert (work.prefill_tokens, work.prefill_context, work.decode_tokens, work.steps) == (64, 100, 19, 20.0)
    assert work.decode_context == sum(range(101, 120))
    assert work.token_context == 64 * 100 + sum(range(101, 120))


def test_requests_in_flight_together_share_the_weight_reads() -> None:
    clock, reg = Clock(), CollectorRegistry()
    counter = ProxyMfu(TINY, reg, clock=clock)
    a = counter.begin()
    b = counter.begin()
    clock.now += 4.0  # both in flight for 4 s: concurrency 2 for each
    counter.end(a, "m", (10, 5, 0))
    counter.end(b, "m", (10, 5, 0))
    half = mfu.request_work(10, 5)
    half.steps /= 2
    want = mfu.estimate(TINY, half)
    assert _values(reg, "m") == (2 * want.flops, 2 * want.read_bytes, 2 * want.write_bytes)
    # The two share 5 steps: the weights are read 5 times, not 10.
    whole = mfu.estimate(TINY, mfu.request_work(10, 5))
    assert 2 * whole.read_bytes - 2 * want.read_bytes == 5 * mfu.weight_read_bytes(TINY)


def test_an_unfinished_request_counts_nothing_but_its_time_in_flight() -> None:
    clock, reg = Clock(), CollectorRegistry()
    counter = ProxyMfu(TINY, reg, clock=clock)
    a = counter.begin()
    clock.now += 1.0
    b = counter.begin()
    clock.now += 1.0
    counter.end(a, "m", None)  # aborted: not counted, but it shared b's first second
    clock.now += 2.0
    counter.end(b, "m", (10, 1, 0))
    work = mfu.request_work(10, 1)
    work.steps /= (1 * 2 + 2 * 1) / 3  # 1 s with a beside it, 2 s alone: mean concurrency 4/3
    want = mfu.estimate(TINY, work)
    assert _values(reg, "m") == (want.flops, want.read_bytes, want.write_bytes)


@dataclass
class Chain:
    proxy_url: str
    sim_registry: CollectorRegistry
    proxy_registry: CollectorRegistry


def _chain(*, enable: bool) -> Iterator[Chain]:
    sim_reg, proxy_reg = CollectorRegistry(), CollectorRegistry()
    sim = SimEngine(load_model_profile("tiny"), load_gpu_profile("h100-sxm"), registry=sim_reg, speed=20.0,
                    enable_mfu_metrics=True, knobs={"enable_prefix_caching": False})  # fmt: skip
    with serve_app(create_app(sim, ServeSettings(), registry=sim_reg, tracing=Tracing.disabled())) as sim_url:
        proxy = OpenAIProxyEngine(sim_url, registry=proxy_reg, mfu_shape=TINY if enable else None)
        with serve_app(create_app(proxy, ServeSettings(), registry=proxy_reg, tracing=Tracing.disabled())) as url:
            yield Chain(url, sim_reg, proxy_reg)


@pytest.fixture
def chain() -> Iterator[Chain]:
    yield from _chain(enable=True)


@pytest.fixture
def chain_off() -> Iterator[Chain]:
    yield from _chain(enable=False)


def _send(url: str, n: int) -> None:
    for i in range(n):
        prompt = " ".join(f"w{i}x{j}" for j in range(5 + 7 * i))  # distinct prompts of growing length
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 3 + 2 * i, "ignore_eos": True, "stream": i % 2 == 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        if not body["stream"]:
            assert r.json()["usage"]["completion_tokens"] == 3 + 2 * i


def test_the_sim_behind_the_proxy_counts_what_the_proxy_estimates(chain: Chain) -> None:
    """One request at a time, unchunked, no prefix cache: the sim's steps are exactly the ones the proxy
    assumes, so the counters agree to float rounding (the concurrency share is 1 up to clock arithmetic)."""
    _send(chain.proxy_url, 6)
    sim, proxy = _values(chain.sim_registry, "tiny"), _values(chain.proxy_registry, "tiny")
    assert all(v is not None and v > 0 for v in sim)
    assert proxy == pytest.approx(sim, rel=1e-9)


def test_without_the_flag_the_proxy_has_no_mfu_series(chain_off: Chain) -> None:
    _send(chain_off.proxy_url, 1)
    text = httpx.get(chain_off.proxy_url + "/metrics").text
    assert "vllm:estimated_" not in text
    assert all(v is not None and v > 0 for v in _values(chain_off.sim_registry, "tiny"))
