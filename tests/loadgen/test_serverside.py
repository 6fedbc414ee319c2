"""Server-side figures from Prometheus: the query sent per stage, the first candidate that answers, failures."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loadgen.serverside import QUERIES, figures_for_stages
from tests.support import required
from tests.support.server import free_port, serve_app


def fake_prometheus(answers: dict[str, float], seen: list[dict[str, str]]) -> Starlette:
    async def query(request: Request) -> JSONResponse:
        params = {k: v[0] for k, v in parse_qs(request.url.query).items()}
        seen.append(params)
        q = params["query"]
        if q == "vector(1)":
            return JSONResponse(
                {"status": "success", "data": {"resultType": "vector", "result": [{"value": [0, "1"]}]}}
            )
        for needle, value in answers.items():
            if needle in q:
                result: list[Any] = [{"metric": {}, "value": [0, str(value)]}]
                return JSONResponse({"status": "success", "data": {"resultType": "vector", "result": result}})
        return JSONResponse({"status": "success", "data": {"resultType": "vector", "result": []}})

    return Starlette(routes=[Route("/api/v1/query", query)])


@pytest.fixture
def prom() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    answers = {
        "loadlens_gpu_memory_used_bytes": 18.3,
        "avg(avg_over_time(loadlens_gpu_utilization_ratio": 0.68,
        # The exporter's window statistic is missing: the in-stage p95 - p5 of the instant values answers.
        "max(quantile_over_time(0.95, loadlens_gpu_utilization_ratio": 0.12,
        "gen_ai_server_time_to_first_token_seconds_sum": 182.0,
    }
    with serve_app(fake_prometheus(answers, seen)) as url:
        yield url, seen


def test_figures_per_stage_with_fallbacks(prom: tuple[str, list[dict[str, str]]]) -> None:
    url, seen = prom
    out = figures_for_stages(url, [("c8", 1000.0, 1180.0)])["c8"]
    assert out["peak_vram_gib"] == 18.3
    assert out["mean_gpu_utilization_ratio"] == 0.68
    assert out["gpu_utilization_peak_to_trough_ratio"] == 0.12
    assert "quantile_over_time(0.05" in out["queries"]["gpu_utilization_peak_to_trough_ratio"]
    assert out["server_mean_ttft_ms"] == 182.0
    assert out["server_p99_ttft_ms"] is None and out["errors"] == []
    assert out["window_seconds"] == 180
    vram = next(p for p in seen if "loadlens_gpu_memory_used_bytes" in p["query"])
    assert "[180s]" in vram["query"] and vram["time"] == "1180.000"


@pytest.mark.parametrize(
    ("stage_s", "window_query"),
    [
        (180.0, "max(avg_over_time(loadlens_gpu_utilization_window_peak_to_trough_ratio[150s]))"),
        (30.0, None),  # not longer than the 30 s window: every value would hold pre-stage samples; not asked
    ],
)
def test_the_swing_skips_the_exporters_window_at_the_stage_start(stage_s: float, window_query: str | None) -> None:
    seen: list[dict[str, str]] = []
    answers = {"max(loadlens_gpu_utilization_window_seconds)": 30.0, "window_peak_to_trough_ratio": 0.25}
    with serve_app(fake_prometheus(answers, seen)) as url:
        out = figures_for_stages(url, [("c8", 1000.0, 1000.0 + stage_s)])["c8"]
    asked = [p["query"] for p in seen if "peak_to_trough" in p["query"]]
    if window_query is None:
        assert asked == [] and out["gpu_utilization_peak_to_trough_ratio"] is None
    else:
        assert asked == [window_query]
        assert out["gpu_utilization_peak_to_trough_ratio"] == 0.25
        assert out["queries"]["gpu_utilization_peak_to_trough_ratio"] == window_query


def test_unreachable_prometheus_is_reported_not_raised() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = figures_for_stages(url, [("a", 0.0, 1.0), ("b", 1.0, 2.0)])
    reason = f"Prometheus {url} unreachable: cannot reach Prometheus at {url}: [Errno 111] Connection refused"
    assert out == {"a": {"errors": [reason]}, "b": {"errors": [reason]}}


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    promtool = required.promtool()
    rules = [
        {
            "record": f"loadlens:check_{name}_{i}",
            "expr": q.replace("{range}", "60s").replace("{inner}", "30s").replace("{seconds}", "60"),
        }
        for name, candidates in QUERIES.items()
        for i, q in enumerate(candidates)
    ]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "loadgen", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
