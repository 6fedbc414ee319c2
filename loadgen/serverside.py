"""Server-side figures per stage from Prometheus (``--prometheus URL``): VRAM, GPU utilisation, server TTFT.

Each figure has an ordered list of PromQL candidates; the first that returns a number wins, and the query
used is recorded next to the figure, so a renamed series shows up as a null with a reason, never as a
wrong number. ``{range}`` is the stage's duration (whole seconds, at least 1 s), evaluated at the stage's end.
Prometheus only knows what it has scraped: the last seconds of the last stage may be missing.

Usage::

    figures = stage_figures("http://127.0.0.1:9090", start=t0, end=t1)
    figures["peak_vram_gib"], figures["queries"]["peak_vram_gib"]
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

GIB = 1024**3

QUERIES: dict[str, tuple[str, ...]] = {
    "peak_vram_gib": (
        f"max(max_over_time(loadlens_gpu_memory_used_bytes[{{range}}])) / {GIB}",
        "max(max_over_time(DCGM_FI_DEV_FB_USED[{range}])) / 1024",  # DCGM reports MiB
    ),
    "mean_gpu_utilization_ratio": (
        "avg(avg_over_time(loadlens_gpu_utilization_ratio[{range}]))",
        "avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL[{range}])) / 100",
    ),
    "gpu_utilization_peak_to_trough_ratio": (
        # The exporter's sampler sees the driver's ~ms samples; p95 - p5 over its window, averaged over the stage.
        "max(avg_over_time(loadlens_gpu_utilization_window_peak_to_trough_ratio[{range}]))",
        "max(max_over_time(loadlens_gpu_utilization_ratio[{range}]))"
        " - min(min_over_time(loadlens_gpu_utilization_ratio[{range}]))",
    ),
    "server_mean_ttft_ms": (
        "1000 * sum(increase(gen_ai_server_time_to_first_token_seconds_sum[{range}]))"
        " / sum(increase(gen_ai_server_time_to_first_token_seconds_count[{range}]))",
        "1000 * sum(increase(vllm:time_to_first_token_seconds_sum[{range}]))"
        " / sum(increase(vllm:time_to_first_token_seconds_count[{range}]))",
    ),
    "server_p99_ttft_ms": (
        "1000 * histogram_quantile(0.99, sum by (le) "
        "(increase(gen_ai_server_time_to_first_token_seconds_bucket[{range}])))",
        "1000 * histogram_quantile(0.99, sum by (le) (increase(vllm:time_to_first_token_seconds_bucket[{range}])))",
    ),
    "server_output_throughput": (
        "sum(increase(loadlens_output_tokens_total[{range}])) / {seconds}",
        "sum(increase(vllm:generation_tokens_total[{range}])) / {seconds}",
    ),
    "server_peak_waiting_requests": ("max(max_over_time(vllm:num_requests_waiting[{range}]))",),
}


def query(base_url: str, promql: str, at: float, timeout: float = 5.0) -> float | None:
    """One instant query; the single sample's value, or None when the result is empty or not a number."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
    with urllib.request.urlopen(url, timeout=timeout) as response:
        doc = json.loads(response.read())
    if doc.get("status") != "success":
        raise ValueError(doc.get("error", "query failed"))
    data = doc.get("data", {})
    result = data.get("result")
    if data.get("resultType") == "scalar":
        value = float(result[1])
    elif isinstance(result, list) and result:
        value = float(result[0]["value"][1])
    else:
        return None
    return value if math.isfinite(value) else None


def stage_figures(base_url: str, *, start: float, end: float, timeout: float = 5.0) -> dict[str, Any]:
    seconds = max(1, round(end - start))
    out: dict[str, Any] = {"window_seconds": seconds, "queries": {}, "errors": []}
    for name, candidates in QUERIES.items():
        out[name] = None
        for template in candidates:
            promql = template.replace("{range}", f"{seconds}s").replace("{seconds}", str(seconds))
            try:
                value = query(base_url, promql, end, timeout)
            except (OSError, ValueError, KeyError, IndexError, urllib.error.URLError) as err:
                out["errors"].append(f"{name}: {err}")
                break  # Prometheus itself is failing; the next candidate would fail the same way
            if value is not None:
                out[name] = round(value, 6)
                out["queries"][name] = promql
                break
    return out


def figures_for_stages(base_url: str, windows: list[tuple[str, float, float]]) -> dict[str, dict[str, Any]]:
    """Figures for each (stage, start, end); one probe first so an unreachable Prometheus costs one timeout."""
    try:
        query(base_url, "vector(1)", time.time())
    except (OSError, ValueError, KeyError, IndexError, urllib.error.URLError) as err:
        return {name: {"errors": [f"Prometheus {base_url} unreachable: {err}"]} for name, _, _ in windows}
    return {name: stage_figures(base_url, start=start, end=end) for name, start, end in windows}
