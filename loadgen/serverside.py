"""Server-side figures per stage from Prometheus (``--prometheus URL``): VRAM, GPU utilisation, server TTFT,
the hot-swap SLA's counts, the prefix cache's hit rate.

Each figure has an ordered list of PromQL candidates; the first that returns a number wins, and the query
used is recorded next to the figure, so a renamed series shows up as a null with a reason, never as a
wrong number. ``{range}`` is the stage's duration (whole seconds, at least 1 s), evaluated at the stage's end.
Engine figures read vLLM's series, then sglang's counterpart (:func:`_engine`); the prefix cache's have
none in the mapping, so they stay vLLM's.
Prometheus only knows what it has scraped: the last seconds of the last stage may be missing.

Usage::

    figures = figures_for_stages("http://127.0.0.1:9090", [("c1", t0, t1)])["c1"]
    figures["peak_vram_gib"], figures["queries"]["peak_vram_gib"]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadlens.contracts.engine_series import BY_VLLM
from loadlens.util.prometheus import PrometheusClient, PrometheusUnreachable, QueryError

GIB = 1024**3


@dataclass(frozen=True)
class _Series:
    name: str
    matchers: str

    def __call__(self, suffix: str = "") -> str:
        """The selector of the series (``suffix``: ``_sum``, ``_count``, ``_bucket`` of a histogram)."""
        return f"{self.name}{suffix}{{{self.matchers}}}" if self.matchers else f"{self.name}{suffix}"


def _engine(vllm: str, form: Callable[[_Series], str]) -> tuple[str, ...]:
    """One engine figure's candidates: ``form`` over vLLM's series, then over its sglang counterpart from
    loadlens/contracts/engine_series.py (the one mapping), so an sglang server's figure answers too.

    ``form`` gets the series ``s``; ``s(suffix)`` is its selector: the name with ``_sum``, ``_count`` or
    ``_bucket`` for a histogram, and the matchers that select the fact. Separate candidates, not a union: the dialects'
    histogram buckets differ, and the query that answered names the dialect. Constant labels of the mapping
    are left out: every figure aggregates them away.
    """
    entry = BY_VLLM[vllm]
    out = [form(_Series(vllm, entry.vllm_matchers))]
    if entry.sglang is not None:
        out.append(form(_Series(entry.sglang.name, entry.sglang.matchers)))
    return tuple(out)


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
        # The exporter's sampler sees the driver's ~ms samples: p95 - p5 over its rolling window, averaged over
        # the part of the stage where that window lies wholly inside the stage ({inner}: the stage minus the
        # window), so idle samples from before the stage never count. Needs a stage longer than the window.
        "max(avg_over_time(loadlens_gpu_utilization_window_peak_to_trough_ratio[{inner}]))",
        # Otherwise (DCGM, or a stage not longer than the window): p95 - p5 of the scraped instant values inside
        # the stage, the same statistic at the scrape interval's resolution.
        "max(quantile_over_time(0.95, loadlens_gpu_utilization_ratio[{range}])"
        " - quantile_over_time(0.05, loadlens_gpu_utilization_ratio[{range}]))",
        "max(quantile_over_time(0.95, DCGM_FI_DEV_GPU_UTIL[{range}])"
        " - quantile_over_time(0.05, DCGM_FI_DEV_GPU_UTIL[{range}])) / 100",
    ),
    "server_mean_ttft_ms": (
        "1000 * sum(increase(gen_ai_server_time_to_first_token_seconds_sum[{range}]))"
        " / sum(increase(gen_ai_server_time_to_first_token_seconds_count[{range}]))",
        *_engine(
            "vllm:time_to_first_token_seconds",
            lambda s: f"1000 * sum(increase({s('_sum')}[{{range}}])) / sum(increase({s('_count')}[{{range}}]))",
        ),
    ),
    "server_p99_ttft_ms": (
        "1000 * histogram_quantile(0.99, sum by (le) "
        "(increase(gen_ai_server_time_to_first_token_seconds_bucket[{range}])))",
        *_engine(
            "vllm:time_to_first_token_seconds",
            lambda s: f"1000 * histogram_quantile(0.99, sum by (le) (increase({s('_bucket')}[{{range}}])))",
        ),
    ),
    "server_output_throughput": (
        "sum(increase(loadlens_output_tokens_total[{range}])) / {seconds}",
        *_engine("vllm:generation_tokens_total", lambda s: f"sum(increase({s()}[{{range}}])) / {{seconds}}"),
    ),
    "server_peak_waiting_requests": _engine(
        "vllm:num_requests_waiting", lambda s: f"max(max_over_time({s()}[{{range}}]))"
    ),
    # The hot-swap SLA's counts (the verdict's lora_swap check): requests blocked behind adapter swaps, those
    # blocked longer than lora_swap.delay_seconds, and the requests the SLA divides by.
    "lora_swap_blocked_requests": ("sum(increase(loadlens_lora_swap_blocking_seconds_count[{range}]))",),
    "lora_swap_delayed_requests": ("sum(increase(loadlens_lora_swap_delayed_requests_total[{range}]))",),
    "slo_eligible_requests": ("sum(increase(loadlens_slo_eligible_requests_total[{range}]))",),
    # The prefix cache, in tokens looked up / found at a request's first scheduling: vLLM >= 0.9 (and the sim)
    # name them vllm:prefix_cache_*; older vLLM vllm:gpu_prefix_cache_* (removed in 0.12).
    "prefix_cache_hit_ratio": (
        "sum(increase(vllm:prefix_cache_hits_total[{range}]))"
        " / sum(increase(vllm:prefix_cache_queries_total[{range}]))",
        "sum(increase(vllm:gpu_prefix_cache_hits_total[{range}]))"
        " / sum(increase(vllm:gpu_prefix_cache_queries_total[{range}]))",
    ),
    "prefix_cache_hit_tokens": (
        "sum(increase(vllm:prefix_cache_hits_total[{range}]))",
        "sum(increase(vllm:gpu_prefix_cache_hits_total[{range}]))",
    ),
    "prefix_cache_query_tokens": (
        "sum(increase(vllm:prefix_cache_queries_total[{range}]))",
        "sum(increase(vllm:gpu_prefix_cache_queries_total[{range}]))",
    ),
}


WINDOW_QUERY = "max(loadlens_gpu_utilization_window_seconds)"


def stage_figures(client: PrometheusClient, *, start: float, end: float) -> dict[str, Any]:
    seconds = max(1, round(end - start))
    out: dict[str, Any] = {"window_seconds": seconds, "queries": {}, "errors": []}
    try:
        exporter_window = client.value_at(WINDOW_QUERY, end)
    except (PrometheusUnreachable, QueryError):
        exporter_window = None
    # Whole seconds of the stage after the exporter's window has filled with the stage's own samples.
    inner = seconds - math.ceil(exporter_window) if exporter_window is not None else 0
    for name, candidates in QUERIES.items():
        out[name] = None
        for template in candidates:
            if "{inner}" in template and inner < 1:
                continue  # the stage is not longer than the exporter's window (or the window is unknown)
            promql = (
                template.replace("{range}", f"{seconds}s")
                .replace("{inner}", f"{inner}s")
                .replace("{seconds}", str(seconds))
            )
            try:
                value = client.value_at(promql, end)
            except (PrometheusUnreachable, QueryError) as err:
                out["errors"].append(f"{name}: {err}")
                break  # Prometheus itself is failing; the next candidate would fail the same way
            if value is not None:
                out[name] = round(value, 6)
                out["queries"][name] = promql
                break
    return out


def figures_for_stages(
    base_url: str, windows: list[tuple[str, float, float]], timeout: float = 5.0
) -> dict[str, dict[str, Any]]:
    """Figures for each (stage, start, end); one probe first so an unreachable Prometheus costs one timeout."""
    client = PrometheusClient(base_url, timeout=timeout)
    try:
        client.check(timeout=timeout)
    except PrometheusUnreachable as err:
        return {name: {"errors": [f"Prometheus {base_url} unreachable: {err}"]} for name, _, _ in windows}
    return {name: stage_figures(client, start=start, end=end) for name, start, end in windows}
