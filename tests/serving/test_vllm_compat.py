"""vLLM compatibility of the sim: vLLM's own example Grafana dashboard queries return data from a real
Prometheus scraping a real ``loadlens serve --engine sim``, and the exposition passes ``promtool check metrics``.

The queries are those of vLLM's examples/observability/prometheus_grafana/grafana.json (panel by panel, see
the reference sheet), with ``$model_name`` and ``$__rate_interval`` substituted as Grafana would.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadlens.util.child import http_child
from loadlens.util.net import free_port
from tests.support import required
from tests.support.prometheus import PrometheusServer, require_prometheus

MODEL = "tiny"


def q(metric: str) -> list[str]:
    """The dashboard's Q(X): p99/p95/p90/p50 from buckets plus the mean from _sum/_count."""
    quantiles = [
        f'histogram_quantile({p}, sum by(le) (rate({metric}_bucket{{model_name="$model_name"}}[$__rate_interval])))'
        for p in ("0.99", "0.95", "0.9", "0.5")
    ]
    mean = (
        f'rate({metric}_sum{{model_name="$model_name"}}[$__rate_interval])'
        f' / rate({metric}_count{{model_name="$model_name"}}[$__rate_interval])'
    )
    return [*quantiles, mean]


VLLM_DASHBOARD = {
    "E2E Request Latency": q("vllm:e2e_request_latency_seconds"),
    "Token Throughput": [
        'rate(vllm:prompt_tokens_total{model_name="$model_name"}[$__rate_interval])',
        'rate(vllm:generation_tokens_total{model_name="$model_name"}[$__rate_interval])',
    ],
    "Inter Token Latency": q("vllm:inter_token_latency_seconds"),
    "Time Per Output Token": q("vllm:request_time_per_output_token_seconds"),
    "Scheduler State": [
        'vllm:num_requests_running{model_name="$model_name"}',
        'vllm:num_requests_waiting{model_name="$model_name"}',
    ],
    "Time To First Token": q("vllm:time_to_first_token_seconds"),
    "Cache Utilization": ['vllm:kv_cache_usage_perc{model_name="$model_name"}'],
    "Request Prompt Length": [
        'sum by(le) (increase(vllm:request_prompt_tokens_bucket{model_name="$model_name"}[$__rate_interval]))'
    ],
    "Request Generation Length": [
        'sum by(le) (increase(vllm:request_generation_tokens_bucket{model_name="$model_name"}[$__rate_interval]))'
    ],
    "Finish Reason": [
        'sum by(finished_reason) (increase(vllm:request_success_total{model_name="$model_name"}[$__rate_interval]))'
    ],
    "Queue Time": ['rate(vllm:request_queue_time_seconds_sum{model_name="$model_name"}[$__rate_interval])'],
    "Requests Prefill and Decode Time": [
        'rate(vllm:request_prefill_time_seconds_sum{model_name="$model_name"}[$__rate_interval])',
        'rate(vllm:request_decode_time_seconds_sum{model_name="$model_name"}[$__rate_interval])',
    ],
    "Max Generation Token in Sequence Group": [
        'rate(vllm:request_max_num_generation_tokens_sum{model_name="$model_name"}[$__rate_interval])'
    ],
}


@pytest.fixture(scope="module")
def sim_server() -> Iterator[str]:
    port = free_port()
    # With vLLM's opt-in MFU counters on, as a vLLM started with --enable-mfu-metrics (its example dashboards
    # chart them).
    cmd = [sys.executable, "-m", "loadlens.cli", "serve", "--engine", "sim", "--model-profile", MODEL,
           "--port", str(port), "--enable-mfu-metrics", "--log-level", "warning"]  # fmt: skip
    with http_child(cmd, port) as url:
        yield url


async def _traffic(url: str, seconds: float) -> None:
    stop = time.monotonic() + seconds
    body = {"model": MODEL, "prompt": "hello " * 40, "max_tokens": 24, "stream": True}

    async def user(client: httpx.AsyncClient) -> None:
        while time.monotonic() < stop:
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for _ in r.aiter_bytes():
                    pass

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.gather(*(user(client) for _ in range(4)))


@pytest.mark.slow
@pytest.mark.timeout(90)  # 17 s in the parallel phase, x5 (tests/support/timeout_margins.py)
def test_vllm_example_dashboard_queries_return_data(sim_server: str, tmp_path: Path) -> None:
    require_prometheus()
    target = sim_server.removeprefix("http://")
    with PrometheusServer(tmp_path, targets={"vllm": [target]}) as prom:
        prom.wait_for_up("vllm")
        asyncio.run(_traffic(sim_server, 8))
        time.sleep(2)  # two more scrapes after the last request
        empty = []
        for panel, exprs in VLLM_DASHBOARD.items():
            for expr in exprs:
                concrete = expr.replace("$model_name", MODEL).replace("$__rate_interval", "15s")
                result = prom.query(concrete)
                values = [float(r["value"][1]) for r in result]
                if not values or all(math.isnan(v) for v in values):
                    empty.append(f"{panel}: {concrete}")
        assert empty == []


def test_exposition_passes_promtool_check_metrics(sim_server: str) -> None:
    promtool = required.promtool()
    asyncio.run(_traffic(sim_server, 1))
    text = httpx.get(sim_server + "/metrics").text
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    # vLLM's own names break lint rules on purpose and are kept for compatibility: the colon prefix, and a
    # histogram named vllm:iteration_tokens_total. Everything else, loadlens' own names included, must pass.
    unexpected = [
        p
        for p in problems
        if not (
            p.startswith("vllm:") and ("should not contain ':'" in p or p.startswith("vllm:iteration_tokens_total"))
        )
    ]
    assert unexpected == [], "\n".join(problems)


# vLLM's default series (loggers.py and the API server's instrumentator) the sim did not export before
# issue 13, by exposed name: every label set they must carry once traffic ran.
DEFAULT_SERIES_ADDED = [
    'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_compute"}',
    'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_cache_hit"}',
    'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external_kv_transfer"}',
    'vllm:prompt_tokens_cached_total{engine="0",model_name="tiny"}',
    'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="tiny",source="device"}',
    'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="awake"}',
    # opt-in in vLLM (--enable-mfu-metrics, which sim_server passes)
    'vllm:estimated_flops_per_gpu_total{engine="0",model_name="tiny"}',
    'vllm:estimated_read_bytes_per_gpu_total{engine="0",model_name="tiny"}',
    'vllm:estimated_write_bytes_per_gpu_total{engine="0",model_name="tiny"}',
    'http_requests_total{handler="/v1/completions",method="POST",status="2xx"}',
    'http_request_duration_seconds_bucket{handler="/v1/completions",le="0.1",method="POST"}',
    'http_request_duration_seconds_bucket{handler="/v1/completions",le="0.5",method="POST"}',
    'http_request_duration_seconds_bucket{handler="/v1/completions",le="1.0",method="POST"}',
    'http_request_duration_seconds_bucket{handler="/v1/completions",le="+Inf",method="POST"}',
    'http_request_duration_highr_seconds_bucket{le="60.0"}',
    'http_request_size_bytes_count{handler="/v1/completions"}',
    'http_response_size_bytes_count{handler="/v1/completions"}',
    "process_start_time_seconds",
]


def test_vllm_default_series_added_in_issue_13_are_exposed(sim_server: str) -> None:
    asyncio.run(_traffic(sim_server, 1))
    lines = httpx.get(sim_server + "/metrics").text.splitlines()
    series = {line.rsplit(" ", 1)[0] for line in lines if line and not line.startswith("#")}
    assert [s for s in DEFAULT_SERIES_ADDED if s not in series] == []
    # The sim's prompt tokens split exactly by source (the three sum to vllm:prompt_tokens_total).
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line and line[0] != "#"}
    lab = 'engine="0",model_name="tiny"'
    by_source = sum(values[f"vllm:prompt_tokens_by_source_total{{{lab},source={src}}}"]
                    for src in ('"local_compute"', '"local_cache_hit"', '"external_kv_transfer"'))  # fmt: skip
    assert by_source == values[f"vllm:prompt_tokens_total{{{lab}}}"] > 0
    # /metrics and /health are excluded from the HTTP series, as in vLLM.
    assert not any('handler="/metrics"' in s or 'handler="/health"' in s for s in series)
