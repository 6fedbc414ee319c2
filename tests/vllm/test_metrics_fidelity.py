"""The sim's ``vllm:`` exposition against a real vLLM's after the same requests: every family, its type, its
label names and its bucket layout. Each difference is allowed only with its reason (``ALLOWED``); a new one,
or one that went away, fails the test. The sim is started with the real server's ``max_model_len`` (1,024),
since vLLM derives its token-count buckets from it (1, 2, 5, 10, ... up to max_model_len)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadlens.util.child import http_child_process
from loadlens.util.net import free_port
from tests.support import metric_shapes
from tests.support import vllm_server as rig
from tests.support.paths import ROOT
from tests.support.vllm_model import SERVED_NAME

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ALLOWED: dict[str, str] = {}
"""Each known difference between the sim's shapes and vLLM 0.32's, with why it is there. None is left: the
sim's ``cache_config_info`` labels, ``external_prefix_cache_*`` and ``mm_cache_*`` now follow vLLM 0.32."""

PLATFORM_VALUES: dict[str, str] = {
    "block_size": "vLLM's CPU platform uses 128-token blocks; vLLM on a GPU, and the sim, 16",
    "effective_attention_block_size": "the block size of the one full-attention group: block_size",
    "num_gpu_blocks": "the CPU cache is VLLM_CPU_KVCACHE_SPACE (1 GiB) of the tiny model's blocks; the sim's is "
    "what its GPU profile leaves next to the weights",
    "kv_cache_max_concurrency": "num_gpu_blocks / blocks per max_model_len request (checked on both sides)",
    "kv_cache_size_tokens": "kv_cache_max_concurrency x max_model_len (checked on both sides)",
    "kv_cache_memory_bytes": "the CPU platform sets it from VLLM_CPU_KVCACHE_SPACE; on a GPU it stays None unless "
    "--kv-cache-memory-bytes is given, and the sim sizes by gpu_memory_utilization",
}
"""``cache_config_info`` labels whose value differs between the CPU vLLM and the sim (a GPU), and why."""
MACHINE_VALUES: dict[str, tuple[str, ...]] = {
    "mamba_ssm_cache_dtype": ("auto", "float32"),  # the CPU platform sets float32 where the CPU has AVX-512 BF16
}
"""Labels whose CPU vLLM value depends on the test machine's CPU: the values it may take."""


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "loadlens.cli", "serve", "--engine", "sim", "--model-profile", "tiny"]
    argv += ["--served-model-name", SERVED_NAME, "--knob", f"max_model_len={rig.MAX_MODEL_LEN}", "--port", str(port)]
    with http_child_process([*argv, "--log-level", "warning"], port, cwd=ROOT) as child:
        yield child.url


def same_requests(base_url: str) -> str:
    """A streamed chat and a plain completion, then the exposition."""
    chat = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    completion = {"model": SERVED_NAME, "prompt": "hello", "max_tokens": 4}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=chat, timeout=60) as resp:
        assert (resp.status_code, b"".join(resp.iter_bytes()).endswith(b"data: [DONE]\n\n")) == (200, True)
    assert httpx.post(base_url + "/v1/completions", json=completion, timeout=60).status_code == 200
    return httpx.get(base_url + "/metrics", timeout=10).text


@pytest.fixture(scope="module")
def expositions(vllm_server: rig.VllmServer, sim_url: str) -> tuple[str, str]:
    """(vLLM's, the sim's) exposition after the same requests."""
    return same_requests(vllm_server.url), same_requests(sim_url)


def test_sim_families_match_vllm_but_for_the_allowed(expositions: tuple[str, str]) -> None:
    real, sim = (metric_shapes.shapes(text, prefix="vllm:") for text in expositions)
    found = metric_shapes.diff(real, sim, "vllm", "sim")
    assert sorted(found - ALLOWED.keys()) == [], "differences without a reason in ALLOWED"
    assert sorted(ALLOWED.keys() - found) == [], "ALLOWED lists differences that are gone"


def cache_config_info(text: str) -> dict[str, str]:
    """The labels of the one ``vllm:cache_config_info`` sample, ``engine`` included."""
    (labels,) = [s.labels for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == "vllm:cache_config_info"]  # fmt: skip
    return dict(labels)


def test_cache_config_info_values_agree_but_for_the_platform(expositions: tuple[str, str]) -> None:
    real, sim = (cache_config_info(text) for text in expositions)
    assert real.keys() == sim.keys()
    for name, values in MACHINE_VALUES.items():
        assert (real[name] in values, sim[name]) == (True, "auto"), name
    differing = {name for name in real if real[name] != sim[name]} - MACHINE_VALUES.keys()
    assert sorted(differing) == sorted(PLATFORM_VALUES)
    # vLLM's capacity arithmetic for one full-attention group, the same on both sides.
    for info in (real, sim):
        blocks_per_request = -(-rig.MAX_MODEL_LEN // int(info["block_size"]))
        concurrency = int(info["num_gpu_blocks"]) / blocks_per_request
        assert info["kv_cache_max_concurrency"] == str(concurrency)
        assert info["kv_cache_size_tokens"] == str(int(concurrency * rig.MAX_MODEL_LEN))
        assert info["effective_attention_block_size"] == info["block_size"]
