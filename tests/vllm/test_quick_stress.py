"""The ``quick`` stress profile through the proxy in front of the session's vLLM, with a real Prometheus
scraping the proxy and vLLM (both in the serving job, as the stack scrapes an upstream), ending in the run's
verdict and ``loadlens report``'s page (docs/real-vllm.md, *Experiments on a real server*).

``quick`` is shortened by its own option, ``--time-scale`` (the stages last a quarter of their 20 s). The
tiny model is text-only with a 1,024-token context, so vLLM refuses quick's image entries and its 1,536-token
long tail with 400: those are failed requests in the results, vLLM's answer, not the proxy's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadlens.contracts.ports import LOADGEN_JOB, SERVE_JOB
from loadlens.contracts.results import parse_result
from loadlens.util.net import free_port
from tests.support.paths import ROOT
from tests.support.prometheus import PrometheusServer, require_prometheus
from tests.vllm.conftest import Proxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TIME_SCALE = "0.25"
CMD = [sys.executable, "-m", "loadlens.cli"]


def hostport(url: str) -> str:
    return url.removeprefix("http://")


def test_quick_profile_through_the_proxy_with_prometheus(vllm_proxy: Proxy, tmp_path: Path) -> None:
    require_prometheus()
    load_port = free_port()
    targets = {SERVE_JOB: [hostport(vllm_proxy.url), hostport(vllm_proxy.upstream.url)],
               LOADGEN_JOB: [f"127.0.0.1:{load_port}"]}  # fmt: skip
    results = tmp_path / "results"
    with PrometheusServer(tmp_path / "prom", targets=targets) as prom:
        prom.wait_for_up(SERVE_JOB)
        load = [*CMD, "load", "--profile", "quick", "--time-scale", TIME_SCALE, "--headless", "--host",
                vllm_proxy.url, "--metrics-port", str(load_port), "--results", str(results), "--run-id", "quick",
                "--prometheus", prom.url, "--progress-interval", "0", "--alert-wait", "30"]  # fmt: skip
        proc = subprocess.run(load, capture_output=True, text=True, timeout=300, cwd=ROOT)
        # 3: completed, but the CPU guard flagged the results (a busy CI box): the figures are still the run's.
        assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
        run_dir = results / "quick"
        report = subprocess.run([*CMD, "report", "--results", str(run_dir), "--prometheus", prom.url],
                                capture_output=True, text=True, timeout=240, cwd=ROOT)  # fmt: skip
        assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
        vllm_queries = prom.query(f'vllm:request_success_total{{job="{SERVE_JOB}"}}')

    doc = json.loads((run_dir / "benchmark_result.json").read_text())
    result = parse_result(doc, "benchmark_result.json")  # the contract, every key typed
    assert result.run.completed
    assert result.run.model == vllm_proxy.upstream.served_name
    assert [s.name for s in result.stages] == ["warmup", "c8", "c16", "c32"]

    # The verdict, judged on the measured stages, with the alerts of the run's window read from Prometheus.
    verdict = result.verdict
    assert verdict is not None
    assert verdict.status in ("pass", "fail")
    assert verdict.headline.startswith(verdict.status.upper())
    assert list(verdict.stages) == ["c8", "c16", "c32", "overall"]
    assert verdict.alerts_source == prom.url and verdict.errors == []
    assert {c.slo for c in verdict.slos} >= {"ttft", "error_ratio"}

    # The client's figures are vLLM's answers: the text requests completed; quick's image entries (25 %) and its
    # 1,536-token long tail (15 %) got vLLM's 400 (no vision, over the 1,024-token context), never a 5xx.
    overall = result.overall
    assert overall is not None and overall.completed and overall.failed
    assert overall.total_output_tokens and overall.total_output_tokens > 0
    assert set(overall.outcomes) == {"success", "client_error"}
    assert set(overall.failure_reasons) == {"HTTP 400 BadRequestError"}

    # Server-side figures per stage from Prometheus: the engine's own series, which only vLLM exposes.
    for stage in result.stages[1:]:
        server = doc["stages"][[s["name"] for s in doc["stages"]].index(stage.name)]["server"]
        assert server["errors"] == [], server["errors"]
        assert server["server_peak_waiting_requests"] is not None
        assert "vllm:num_requests_waiting" in server["queries"]["server_peak_waiting_requests"]
        assert server["prefix_cache_query_tokens"] is not None and server["prefix_cache_query_tokens"] > 0
        assert server["peak_vram_gib"] is None  # a CPU vLLM: no GPU series anywhere (absent, never 0)
        assert server["mean_gpu_utilization_ratio"] is None
    assert vllm_queries and all(s["metric"]["instance"] == hostport(vllm_proxy.upstream.url) for s in vllm_queries)

    page = (run_dir / "report" / "index.html").read_text()
    assert verdict.headline.split(": ", 1)[1] in page
    sections = dict(re.findall(r'<h2 id="([a-z]+)">(.*?)(?=<h2 id=|$)', page, flags=re.S))
    assert sections["engine"].count("<img") > 0  # vLLM's queue and cache charts, from Prometheus
    assert 'id="gpu-nodata"' in sections["gpu"] and 'id="vram-nodata"' in sections["vram"]  # a CPU vLLM
