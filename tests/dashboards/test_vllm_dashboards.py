"""vLLM's own Grafana dashboards and production-stack's, every query, against a real Prometheus scraping a
real ``loadlens serve --engine sim`` under load.

The dashboards are the copies in tests/fixtures/vllm_dashboards/ (upstream paths and commits in its
README). Each target's expression gets Grafana's variable substitution (one job ``vllm``, the served model,
the target's instance, engine 0, the dashboards' default SLO thresholds) and runs as a range query over the
load window. The test asserts the exact set of queries that stay empty; every entry says why (also in
docs/sim-engine.md §10, "vLLM dashboards against the sim").
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile
from exporters.serving.tracing import Tracing
from tests.support.prometheus import PrometheusServer, require_prometheus
from tests.support.server import serve_app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_dashboards"
MODEL = "tiny"
JOB = "vllm"
# The load: each user sends at least REQUESTS_PER_USER requests and goes on for at least LOAD_SECONDS. The
# events the panels need (evictions, reuse gaps) are counted in requests, so a loaded machine takes longer
# instead of producing fewer (300 is about what 10 s gave on the loaded 2-core box, 357-366 per user; a 3 s load
# of at least 40 per user already left exactly EXPECTED_EMPTY empty); the seconds give the 5 s rate windows
# their scrapes.
LOAD_SECONDS = 10.0
REQUESTS_PER_USER = 300

_SPEC = "no speculative decoding in the sim (no draft model, so vLLM does not export spec_decode_* either)"
_CONNECTOR = "needs a KV connector (--kv-transfer-config); the sim has none, nor does a default vLLM"
_NIXL = "NIXL transfer series exist only with NixlConnector (P/D disaggregation)"
_OFFLOAD = "KV offloading series exist only with OffloadingConnector / SimpleCPUOffloadConnector"
_EXTERNAL = (
    "vllm:external_prefix_cache_* exist (as on every vLLM 0.32) but stay 0 without a KV connector: the hit rate "
    "divides by queries > 0"
)
_MM = "vllm:mm_cache_* exist (as on every vLLM 0.32) but stay 0 for text-only requests: the rate divides by queries > 0"
_SLEEP_OPS = "sleep-mode and RL weight-update operation histograms: the sim has no sleep mode or weight updates"
_ROUTER = "a production-stack router series (vllm_router), not exported by vLLM or the sim"
_GONE = "vllm:gpu_prefix_cache_* was removed in vLLM 0.12 (now vllm:prefix_cache_*); production-stack still queries it"
_LMCACHE = "an LMCache series, exported by LMCache inside vLLM, not by vLLM itself or the sim"

# Every query that stays empty, by "<fixture> [<panel>.<target>] <panel title> / <legend>", and why.
EXPECTED_EMPTY: dict[str, str] = {
    "production-stack_lmcache-dashboard [1.0] LMCache retrieve speed (K Tokens / sec) / __auto": _LMCACHE,
    "production-stack_lmcache-dashboard [2.0] Cache hit rate (%) in last 1 minute / __auto": _LMCACHE,
    "production-stack_lmcache-dashboard [3.0] Local CPU cache usage (GB) / __auto": _LMCACHE,
    "production-stack_lmcache-dashboard [4.0] Number of requested tokens in total / __auto": _LMCACHE,
    "production-stack_lmcache-dashboard [5.0] Number of hit tokens in total / __auto": _LMCACHE,
    "production-stack_vllm-dashboard [1.0] Available vLLM instances / vLLM instances": _ROUTER,
    "production-stack_vllm-dashboard [12.0] GPU KV Cache Hit Rate / {{instance}}": _GONE,
    "production-stack_vllm-dashboard [15.0] CPU Usage (%) / CPU Usage": _ROUTER,
    "production-stack_vllm-dashboard [16.0] Memory Usage (%) / Memory Usage": _ROUTER,
    "production-stack_vllm-dashboard [17.0] Disk Usage (%) / Disk Usage": _ROUTER,
    "production-stack_vllm-dashboard [5.0] Current QPS / Current QPS": _ROUTER,
    "vllm_instances [22.0] Sleep mode and weight update operations (selected time range) / __auto": _SLEEP_OPS,
    "vllm_instances [22.1] Sleep mode and weight update operations (selected time range) / __auto": _SLEEP_OPS,
    "vllm_instances [22.2] Sleep mode and weight update operations (selected time range) / __auto": _SLEEP_OPS,
    "vllm_kv_cache [13.1] Cache hit rates / external prefix cache": _EXTERNAL,
    "vllm_kv_cache [13.2] Cache hit rates / multimodal cache": _MM,
    "vllm_kv_cache [17.0] External prefix cache hit rate / hit rate": _EXTERNAL,
    "vllm_kv_cache [18.0] Requests waiting on KV loads / {{stage}}": _CONNECTOR,
    "vllm_kv_cache [20.0] Transfer duration / p50": _NIXL,
    "vllm_kv_cache [20.1] Transfer duration / p95": _NIXL,
    "vllm_kv_cache [20.2] Transfer duration / p99": _NIXL,
    "vllm_kv_cache [20.3] Transfer duration / mean": _NIXL,
    "vllm_kv_cache [21.0] Transfer throughput / aggregate": _NIXL,
    "vllm_kv_cache [21.1] Transfer throughput / per transfer": _NIXL,
    "vllm_kv_cache [22.0] Transfers / s / transfers": _NIXL,
    "vllm_kv_cache [23.0] Bytes per transfer / p50": _NIXL,
    "vllm_kv_cache [23.1] Bytes per transfer / p95": _NIXL,
    "vllm_kv_cache [23.2] Bytes per transfer / p99": _NIXL,
    "vllm_kv_cache [23.3] Bytes per transfer / mean": _NIXL,
    "vllm_kv_cache [24.0] Transfer post time / p50": _NIXL,
    "vllm_kv_cache [24.1] Transfer post time / p95": _NIXL,
    "vllm_kv_cache [24.2] Transfer post time / p99": _NIXL,
    "vllm_kv_cache [24.3] Transfer post time / mean": _NIXL,
    "vllm_kv_cache [25.0] Descriptors per transfer / p50": _NIXL,
    "vllm_kv_cache [25.1] Descriptors per transfer / p95": _NIXL,
    "vllm_kv_cache [25.2] Descriptors per transfer / p99": _NIXL,
    "vllm_kv_cache [25.3] Descriptors per transfer / mean": _NIXL,
    "vllm_kv_cache [26.0] Transfer failures / s / failed transfers": _NIXL,
    "vllm_kv_cache [26.1] Transfer failures / s / failed notifications": _NIXL,
    "vllm_kv_cache [26.2] Transfer failures / s / expired KV": _NIXL,
    "vllm_kv_cache [26.3] Transfer failures / s / late notifications": _NIXL,
    "vllm_kv_cache [27.0] Offload throughput / load": _OFFLOAD,
    "vllm_kv_cache [27.1] Offload throughput / store": _OFFLOAD,
    "vllm_kv_cache [28.0] Offload transfer bandwidth / load": _OFFLOAD,
    "vllm_kv_cache [28.1] Offload transfer bandwidth / store": _OFFLOAD,
    "vllm_kv_cache [29.0] Mean offload transfer size / load": _OFFLOAD,
    "vllm_kv_cache [29.1] Mean offload transfer size / store": _OFFLOAD,
    "vllm_kv_cache [30.0] Offload lookup latency p99 / sync": _OFFLOAD,
    "vllm_kv_cache [30.1] Offload lookup latency p99 / async": _OFFLOAD,
    "vllm_kv_cache [31.0] CPU offload buffer usage / total": _OFFLOAD,
    "vllm_kv_cache [31.1] CPU offload buffer usage / stores": _OFFLOAD,
    "vllm_kv_cache [31.2] CPU offload buffer usage / loads": _OFFLOAD,
    "vllm_kv_cache [32.0] Failed and skipped stores / s / allocation failures": _OFFLOAD,
    "vllm_kv_cache [32.1] Failed and skipped stores / s / skipped": _OFFLOAD,
    "vllm_kv_cache [33.0] Store admission outcomes / {{outcome}}": _OFFLOAD,
    "vllm_kv_cache [34.0] Blocks restored from offload / s / blocks": _OFFLOAD,
    "vllm_kv_cache [35.0] Offload pool blocks / pinned": _OFFLOAD,
    "vllm_kv_cache [35.1] Offload pool blocks / pending stores": _OFFLOAD,
    "vllm_overview [32.1] Cache hit rates / external prefix cache": _EXTERNAL,
    "vllm_overview [32.2] Cache hit rates / multimodal cache": _MM,
    "vllm_speculative_decoding [0.0] Draft acceptance rate / __auto": _SPEC,
    "vllm_speculative_decoding [1.0] Mean acceptance length / __auto": _SPEC,
    "vllm_speculative_decoding [10.0] Draft tokens / s / proposed": _SPEC,
    "vllm_speculative_decoding [10.1] Draft tokens / s / accepted": _SPEC,
    "vllm_speculative_decoding [10.2] Draft tokens / s / rejected": _SPEC,
    "vllm_speculative_decoding [2.0] Accepted tokens / s / __auto": _SPEC,
    "vllm_speculative_decoding [3.0] Draft tokens / s / __auto": _SPEC,
    "vllm_speculative_decoding [4.0] Drafts / s / __auto": _SPEC,
    "vllm_speculative_decoding [5.0] Output from accepted drafts / __auto": _SPEC,
    "vllm_speculative_decoding [6.0] Draft acceptance rate / {{model_name}}": _SPEC,
    "vllm_speculative_decoding [7.0] Mean acceptance length / {{model_name}}": _SPEC,
    "vllm_speculative_decoding [8.0] Acceptance rate by draft position / position {{position}}": _SPEC,
    "vllm_speculative_decoding [9.0] Draft acceptance rate by engine / {{instance}} · engine {{engine}}": _SPEC,
}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []) or [])


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, expr) of every target of every fixture dashboard."""
    out: list[tuple[str, str]] = []
    for path in sorted(FIXTURES.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for i, panel in enumerate(_panels(doc.get("panels", []))):
            targets = [t for t in panel.get("targets", []) or [] if "expr" in t]
            for j, target in enumerate(targets):
                legend = target.get("legendFormat") or target.get("refId", "")
                out.append((f"{path.stem} [{i}.{j}] {panel.get('title', '')} / {legend}", target["expr"]))
    return out


def concrete(expr: str, instance: str, window_s: int) -> str:
    values = {
        "$__rate_interval": "5s",
        "$__range": f"{window_s}s",
        "$Deployment_id": MODEL,
        "$model_name": MODEL,
        "$instance": instance,
        "$engine": "0",
        "$job": JOB,
        "$ttft_slo": "1.0",  # the overview dashboard's default selections
        "$tpot_slo": "0.1",
    }
    for name, value in values.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


async def _load(url: str) -> None:
    """Streaming and whole completions, some refusals. Prompts cycle through: a prefix shared by all (prefix
    hits that stay cached), one of 23 topics (blocks reused now and then, so some are evicted after several
    accesses: reuse gaps) and a unique one (fills the cache, forcing evictions)."""
    stop = time.monotonic() + LOAD_SECONDS
    shared = "system prompt " * 24

    def prompt(n: int, i: int) -> str:
        kind = i % 3
        if kind == 0:
            return f"{shared} question {n} {i}"
        if kind == 1:
            return f"topic {i % 23} " * 20 + f"question {n} {i}"
        return f"unique {n} {i} " * 20

    async def user(client: httpx.AsyncClient, n: int) -> None:
        i = 0
        while i < REQUESTS_PER_USER or time.monotonic() < stop:
            body = {"model": MODEL, "prompt": prompt(n, i), "max_tokens": 16, "stream": i % 2 == 0}
            async with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    pass
            i += 1

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        assert (await client.post("/v1/completions", json={"model": "nope", "prompt": "x"})).status_code == 404
        assert (await client.get("/no/such/path")).status_code == 404
        await asyncio.gather(*(user(client, n) for n in range(4)))


@pytest.mark.slow
@pytest.mark.timeout(120)  # 19-21 s measured on the loaded 2-core box, x5 (tests/support/timeout_margins.py)
def test_vllm_and_production_stack_dashboards_against_the_sim(tmp_path: Path) -> None:
    require_prometheus()
    queries = dashboard_queries()
    assert len(queries) == 332
    registry = CollectorRegistry()
    # A small KV cache (160 blocks; one 2048-token sequence needs 128) so prefix-cached blocks are evicted
    # within seconds and the KV-block residency panels have data.
    # vLLM's MFU counters on (its --enable-mfu-metrics): vllm_instances.json charts them.
    engine = SimEngine(
        load_model_profile(MODEL),
        load_gpu_profile("h100-sxm"),
        registry=registry,
        knobs={"num_gpu_blocks": 160},
        enable_mfu_metrics=True,
    )
    app = create_app(engine, ServeSettings(), registry=registry, tracing=Tracing.disabled())
    with serve_app(app) as url:
        target = url.removeprefix("http://")
        with PrometheusServer(tmp_path, targets={JOB: [target]}) as prom:
            prom.wait_for_up(JOB)
            start = time.time()
            asyncio.run(_load(url))
            time.sleep(3)  # a few more scrapes after the last request
            end = time.time()
            window = math.ceil(end - start) + 1
            empty = []
            for where, expr in queries:
                data = prom.api("query_range", query=concrete(expr, target, window), start=f"{start:.3f}",
                                end=f"{end:.3f}", step="1")  # fmt: skip
                values = [float(v) for series in data["result"] for _, v in series["values"]]
                if not any(not math.isnan(v) for v in values):
                    empty.append(where)
    assert set(EXPECTED_EMPTY) <= {where for where, _ in queries}, "EXPECTED_EMPTY names a query that is gone"
    print(f"{len(queries)} queries, {len(queries) - len(empty)} with data")
    assert sorted(empty) == sorted(EXPECTED_EMPTY), "\n".join(sorted(set(empty) ^ set(EXPECTED_EMPTY)))
