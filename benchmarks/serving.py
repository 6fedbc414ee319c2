"""Serving-layer benchmarks: simulator capacity over HTTP, proxy overhead, instrumentation cost per token.

Run: ``python -m benchmarks.serving [--quick]`` (``make bench`` runs it). Servers are real ``loadlens serve``
processes on 127.0.0.1; the load comes from one asyncio/aiohttp client process. These machines are noisy,
so comparisons run side by side in one invocation, alternating A and B, and report medians of rounds.

1. capacity: streams S concurrent closed-loop requests (max_tokens=128, ignore_eos) against
   ``--engine sim`` for D seconds; reports delivered output tokens/s, client ITL p50/p99, and the sim's own
   timing error (wake-up lateness against its schedule, from ``loadlens_sim_timing_error_seconds``).
2. proxy: the same load directly against a sim server and through ``--engine openai`` in front of it;
   reports TTFT/ITL p50/p99 and tokens/s for both, and the differences.
3. instrumentation: CPU time of the per-token path (metrics + a live tracer) and the per-request path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import aiohttp
import httpx

from loadlens.util.child import http_child
from loadlens.util.net import free_port


@dataclass
class LoadResult:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def server(*args: str) -> AbstractContextManager[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "loadlens.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    return http_child(cmd, port)


async def _one_stream(session: aiohttp.ClientSession, url: str, model: str, max_tokens: int, out: LoadResult) -> None:
    body = {
        "model": model,
        "prompt": "benchmark prompt " * 32,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    start = time.perf_counter()
    last: float | None = None
    async with session.post(url + "/v1/completions", json=body) as response:
        if response.status != 200:
            out.errors += 1
            await response.read()
            return
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            now = time.perf_counter()
            text = json.loads(line[6:])["choices"][0]["text"]
            if not text:
                continue
            out.tokens += 1
            if last is None:
                out.ttft.append(now - start)
            else:
                out.itl.append(now - last)
            last = now
    out.requests += 1


async def _load(url: str, model: str, streams: int, seconds: float, max_tokens: int = 128) -> LoadResult:
    out = LoadResult()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        stop_at = time.perf_counter() + seconds

        async def user() -> None:
            while time.perf_counter() < stop_at:
                await _one_stream(session, url, model, max_tokens, out)

        # Warm the connection pool and the server's code paths outside the measured window.
        await asyncio.gather(*(_one_stream(session, url, model, 4, LoadResult()) for _ in range(streams)))
        begun = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(streams)))
        out.seconds = time.perf_counter() - begun
    return out


def _histogram_quantile(text: str, name: str, q: float) -> float | None:
    """Quantile q from a Prometheus text exposition, interpolated inside its bucket like histogram_quantile()."""
    pattern = re.compile(rf'^{name}_bucket{{.*le="([^"]+)".*}} (\S+)$', re.M)
    rows = sorted((float(m.group(1)), float(m.group(2))) for m in pattern.finditer(text))
    if not rows or rows[-1][1] == 0:
        return None
    rank = q * rows[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in rows:
        if count >= rank:
            if le == float("inf"):
                return prev_le  # beyond the last finite bucket: report its bound (a lower bound)
            return prev_le + (le - prev_le) * (rank - prev_count) / max(count - prev_count, 1e-12)
        prev_le, prev_count = le, count
    return rows[-1][0]


def bench_capacity(streams_list: list[int], seconds: float, runs: list[tuple[str, str, float]]) -> None:
    """For each (model, gpu, speed): one server process, closed-loop streams, delivered tok/s and lateness.

    A fast modeled GPU (tiny, or a high speed) saturates the server's CPU: that row is its capacity. A
    real-time Llama-8B on an H100 is what the sim is meant to reproduce: there the timing error matters.
    """
    print("\n## Simulator over HTTP: delivered tokens/s and the sim's timing error (one server process)")
    heads = (
        "model@gpu",
        "speed",
        "streams",
        "tok/s",
        "req/s",
        "ITL p50 ms",
        "ITL p99 ms",
        "late p50 ms",
        "late p99 ms",
    )
    widths = (28, 5, 7, 8, 7, 10, 10, 11, 11)
    print(" ".join(f"{h:>{w}}" for h, w in zip(heads, widths, strict=True)))
    for model, gpu, speed in runs:
        for streams in streams_list:
            knobs = ["--knob", "max_waiting=100000"]
            sim = ("--engine", "sim", "--model-profile", model, "--gpu-profile", gpu, "--speed", str(speed))
            with server(*sim, *knobs) as url:
                result = asyncio.run(_load(url, model, streams, seconds))
                text = httpx.get(url + "/metrics").text
            late = [_histogram_quantile(text, "loadlens_sim_timing_error_seconds", q) for q in (0.5, 0.99)]
            cells = [f"{model}@{gpu}", f"{speed:g}", str(streams), f"{result.tok_s:.0f}",
                     f"{result.requests / result.seconds:.1f}", f"{pct(result.itl, 0.5) * 1000:.2f}",
                     f"{pct(result.itl, 0.99) * 1000:.2f}"]  # fmt: skip
            cells += [f"{v * 1000:.2f}" if v is not None else "n/a" for v in late]
            print(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)), flush=True)


def bench_proxy(streams_list: list[int], seconds: float, rounds: int, model: str, gpu: str) -> None:
    print(
        f"\n## Proxy overhead: direct vs through --engine openai (model {model}, gpu {gpu}; medians of {rounds} rounds)"
    )
    print(f"{'streams':>8} {'path':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'tok/s':>8}")
    sim_args = ("--engine", "sim", "--model-profile", model, "--gpu-profile", gpu, "--knob", "max_waiting=100000")
    with server(*sim_args) as sim_url, server("--engine", "openai", "--upstream", sim_url) as proxy_url:
        for streams in streams_list:
            runs: dict[str, list[LoadResult]] = {"direct": [], "proxy": []}
            for _ in range(rounds):
                for name, url in (("direct", sim_url), ("proxy", proxy_url)):
                    runs[name].append(asyncio.run(_load(url, model, streams, seconds)))
            summary = {}
            for name, results in runs.items():
                row = {
                    "ttft50": statistics.median(pct(r.ttft, 0.5) for r in results) * 1000,
                    "ttft99": statistics.median(pct(r.ttft, 0.99) for r in results) * 1000,
                    "itl50": statistics.median(pct(r.itl, 0.5) for r in results) * 1000,
                    "itl99": statistics.median(pct(r.itl, 0.99) for r in results) * 1000,
                    "tok_s": statistics.median(r.tok_s for r in results),
                }
                summary[name] = row
                print(
                    f"{streams:>8} {name:>7} {row['ttft50']:9.2f} {row['ttft99']:9.2f} {row['itl50']:8.2f}"
                    f" {row['itl99']:8.2f} {row['tok_s']:8.0f}"
                )
            d, p = summary["direct"], summary["proxy"]
            print(
                f"{streams:>8} {'delta':>7} {p['ttft50'] - d['ttft50']:+9.2f} {p['ttft99'] - d['ttft99']:+9.2f}"
                f" {p['itl50'] - d['itl50']:+8.2f} {p['itl99'] - d['itl99']:+8.2f}"
                f" {(p['tok_s'] / d['tok_s'] - 1) * 100:+7.1f}%"
            )


def bench_instrumentation(tokens: int = 200_000) -> None:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from prometheus_client import CollectorRegistry

    from exporters.serving.engine import RequestTiming
    from exporters.serving.lifecycle import RequestLifecycle
    from exporters.serving.metrics import ServingMetrics
    from exporters.serving.request_log import RequestLogger
    from exporters.serving.tracing import Tracing
    from loadlens.contracts.slo import load_slos

    class NullExporter(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

    slos = load_slos()
    metrics = ServingMetrics(CollectorRegistry(), slos, "sim", "bench")
    tracing = Tracing.from_env("bench", metrics.spans_dropped.inc, exporter=NullExporter())
    logger = RequestLogger("logfmt")
    per_request = 256

    def one_request(n_tokens: int) -> None:
        life = RequestLifecycle.start(
            metrics=metrics, logger=logger, tracer=tracing.tracer, parent=None, parent_ids=None,
            request_id="r", path="/v1/completions", endpoint="completions", requested_model="m", model_label="m",
            priority=0, priority_class=slos.classes[0], stream=True, arrival=time.monotonic(),
        )  # fmt: skip
        life.admit()
        for i in range(1, n_tokens + 1):
            life.on_event(time.monotonic(), 1, 100, i)
        life.finish_ok("length", RequestTiming())

    requests = tokens // per_request
    samples = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(requests):
            one_request(per_request)
        samples.append((time.process_time() - t0) / (requests * per_request))
    per_token_total = statistics.median(samples)
    t0 = time.process_time()
    for _ in range(2000):
        one_request(1)
    per_request_cost = (time.process_time() - t0) / 2000
    print("\n## Instrumentation cost (metrics + live tracer, CPU time, medians of 5)")
    print(f"  per streamed token, amortised over {per_request}-token requests: {per_token_total * 1e6:.2f} us")
    print(f"  per request (span, log line, SLA verdict, 1 token): {per_request_cost * 1e6:.1f} us")
    tracing.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs (smoke test of the benchmark itself)")
    parser.add_argument("--only", choices=["capacity", "proxy", "instrumentation"], default=None)
    args = parser.parse_args(argv)
    seconds = 3.0 if args.quick else 10.0
    rounds = 1 if args.quick else 3
    print(f"# loadlens serving benchmarks ({os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M:%S')})")
    if args.only in (None, "capacity"):
        bench_capacity(
            [64, 256], seconds, [("tiny", "h100-sxm", 1.0), ("deepseek-r1-distill-llama-8b", "h100-sxm", 1.0)]
        )
    if args.only in (None, "proxy"):
        bench_proxy([16, 64], seconds, rounds, "deepseek-r1-distill-llama-8b", "h100-sxm")
    if args.only in (None, "instrumentation"):
        bench_instrumentation(20_000 if args.quick else 200_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
