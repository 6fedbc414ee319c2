"""Serving-layer benchmarks: simulator capacity over HTTP, proxy overhead, instrumentation cost per token.

Run: ``python -m benchmarks.serving [--quick]`` (``make bench`` runs it). Servers are real ``loadlens serve``
processes on 127.0.0.1; the load comes from one asyncio/aiohttp client process. These machines are noisy,
so comparisons run side by side in one invocation, alternating A and B, and report medians of rounds.

1. capacity: streams S concurrent closed-loop requests (max_tokens=128, ignore_eos) against
   ``--engine sim`` for D seconds; reports delivered output tokens/s, client ITL p50/p99, and the sim's own
   timing error (wake-up lateness against its schedule, from ``loadlens_sim_timing_error_seconds``).
2. proxy: the same load directly against a sim server and through ``--engine openai`` in front of it (and,
   with ``--proxy-baseline DIR``, through another source tree's proxy; with ``--proxy-floor``, through a
   zero-work TCP relay, benchmarks/tcp_relay.py: the floor of any proxy's CPU), from the reference client in
   benchmarks/stream_client.py; alternating rounds of 15 s (``--quick``: 2 rounds of 3 s) at 16 and 64
   streams; reports TTFT/ITL p50/p99, tokens/s, the differences to direct and the throughput ratio, and CPU
   per forwarded chunk of the sim, the proxy (/proc/<pid>/stat) and the client itself.
3. instrumentation: CPU time of the per-token path (metrics + a live tracer) and the per-request path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx

from benchmarks import stream_client
from loadlens.util.child import http_child
from loadlens.util.http import http_ok
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


@contextlib.contextmanager
def _server_process(*args: str, src: str | None = None) -> Iterator[tuple[str, int]]:
    """A ``loadlens serve`` child: (url, pid), the pid for its CPU time; ``src``: run another source tree's."""
    port = free_port()
    cmd = [sys.executable, "-m", "loadlens.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=src)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not http_ok(url + "/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(args)} did not start")
            time.sleep(0.05)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pin(pid: int, cpus: set[int]) -> None:
    """Run every thread of process ``pid`` (0: this one) on ``cpus`` only."""
    tasks = os.listdir(f"/proc/{pid or os.getpid()}/task")
    for tid in tasks:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc/<pid>/stat (fields 14 and 15, in clock ticks)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class ProxyRun:
    result: stream_client.LoadResult
    sim_cpu_s: float
    proxy_cpu_s: float  # 0 for the direct path


def bench_proxy(
    streams_list: list[int],
    seconds: float,
    rounds: int,
    model: str,
    gpu: str,
    baseline_src: str | None = None,
    floor: bool = False,
    pinned: bool = False,
) -> dict[str, object]:
    """Direct against a sim server vs through ``--engine openai`` in front of the same sim, side by side:
    rounds alternate the order (direct first, then proxy first); figures are medians of the rounds. The
    reference client (benchmarks/stream_client.py) reports its own CPU time so it is seen not to be the
    bottleneck; server CPU comes from /proc/<pid>/stat, per chunk = CPU seconds / chunks forwarded.
    ``baseline_src``: a second proxy run from another source tree (``git archive <commit> | tar -x -C DIR``)
    in front of the same sim, as a third path ``before``. ``floor``: also a path ``relay`` through
    benchmarks/tcp_relay.py, which forwards bytes and nothing else: the floor of any proxy's CPU per chunk.
    ``pinned``: every path in the middle (proxy, before, relay) runs on the host's last CPU, the sim and the
    client on the others, so they meet the same core from round to round (fewer migrations, no sharing with
    the load they measure); each middle path is then also compared with the relay round by round (the ratio
    of the two runs next to each other), and the median and range of those ratios printed."""
    print(
        f"\n## Proxy overhead: direct vs through --engine openai (model {model}, gpu {gpu}, real time, {seconds:g} s"
        f" runs; medians of {rounds} alternating rounds)"
    )
    heads = ("streams", "path", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "tok/s", "chunks",
             "sim us/chunk", "proxy us/chunk", "client us/chunk", "client CPU %")  # fmt: skip
    widths = (7, 6, 9, 9, 8, 8, 8, 8, 12, 14, 15, 12)
    print(" ".join(f"{h:>{w}}" for h, w in zip(heads, widths, strict=True)))
    sim_args = ("--engine", "sim", "--model-profile", model, "--gpu-profile", gpu, "--knob", "max_waiting=100000")
    report: dict[str, object] = {}
    with contextlib.ExitStack() as servers:
        sim_url, sim_pid = servers.enter_context(_server_process(*sim_args))
        proxy_url, proxy_pid = servers.enter_context(_server_process("--engine", "openai", "--upstream", sim_url))
        paths = {"direct": (sim_url, None), "proxy": (proxy_url, proxy_pid)}
        if baseline_src is not None:
            before = _server_process("--engine", "openai", "--upstream", sim_url, src=baseline_src)
            before_url, before_pid = servers.enter_context(before)
            paths["before"] = (before_url, before_pid)
        if floor:
            port = free_port()
            relay_cmd = [sys.executable, "-m", "benchmarks.tcp_relay", str(port), sim_url.rsplit(":", 1)[1]]
            relay = subprocess.Popen(relay_cmd)
            servers.callback(relay.wait)
            servers.callback(relay.terminate)
            while not http_ok(f"http://127.0.0.1:{port}/health"):
                time.sleep(0.05)
            paths["relay"] = (f"http://127.0.0.1:{port}", relay.pid)
        cpus = sorted(os.sched_getaffinity(0))
        if pinned and len(cpus) >= 2:
            middle, rest = {cpus[-1]}, set(cpus[:-1])
            for _, pid in paths.values():
                if pid is not None:
                    pin(pid, middle)
            pin(sim_pid, rest)
            pin(0, rest)
            print(f"(pinned: proxy paths on CPU {cpus[-1]}, sim and client on CPUs {sorted(rest)})")
        for streams in streams_list:
            runs: dict[str, list[ProxyRun]] = {name: [] for name in paths}
            for i in range(rounds):
                order = list(paths.items())
                for name, (url, pid) in order if i % 2 == 0 else order[::-1]:
                    sim0, proxy0 = cpu_seconds(sim_pid), cpu_seconds(pid) if pid else 0.0
                    result = stream_client.run_load(url, model, streams, seconds)
                    sim1, proxy1 = cpu_seconds(sim_pid), cpu_seconds(pid) if pid else 0.0
                    runs[name].append(ProxyRun(result, sim1 - sim0, proxy1 - proxy0))
            summary: dict[str, dict[str, Any]] = {}
            for name, group in runs.items():
                med = statistics.median
                row = {
                    "ttft50": med(pct(r.result.ttft, 0.5) for r in group) * 1000,
                    "ttft99": med(pct(r.result.ttft, 0.99) for r in group) * 1000,
                    "itl50": med(pct(r.result.itl, 0.5) for r in group) * 1000,
                    "itl99": med(pct(r.result.itl, 0.99) for r in group) * 1000,
                    "tok_s": med(r.result.tok_s for r in group),
                    "chunks": med(r.result.chunks for r in group),
                    "sim_us": med(r.sim_cpu_s / max(r.result.chunks, 1) for r in group) * 1e6,
                    "proxy_us": med(r.proxy_cpu_s / max(r.result.chunks, 1) for r in group) * 1e6,
                    "client_us": med(r.result.client_cpu_s / max(r.result.chunks, 1) for r in group) * 1e6,
                    "client_pct": med(r.result.client_cpu_s / r.result.seconds for r in group) * 100,
                    "errors": sum(r.result.errors for r in group),
                }
                summary[name] = row
                cells = [str(streams), name, f"{row['ttft50']:.2f}", f"{row['ttft99']:.2f}", f"{row['itl50']:.2f}",
                         f"{row['itl99']:.2f}", f"{row['tok_s']:.0f}", f"{row['chunks']:.0f}",
                         f"{row['sim_us']:.1f}", f"{row['proxy_us']:.1f}" if name != "direct" else "-",
                         f"{row['client_us']:.1f}", f"{row['client_pct']:.0f}"]  # fmt: skip
                print(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)), flush=True)
            d = summary["direct"]
            for name in (n for n in paths if n != "direct"):
                p = summary[name]
                print(
                    f"{streams:>7} {name[:2] + '-d':>6} {p['ttft50'] - d['ttft50']:+9.2f}"
                    f" {p['ttft99'] - d['ttft99']:+9.2f} {p['itl50'] - d['itl50']:+8.2f}"
                    f" {p['itl99'] - d['itl99']:+8.2f}  throughput ratio {p['tok_s'] / d['tok_s']:.4f};"
                    f" errors direct {d['errors']}, {name} {p['errors']}",
                    flush=True,
                )
            if "relay" in runs:
                for name in (n for n in paths if n not in ("direct", "relay")):
                    ratios = sorted(
                        (p.proxy_cpu_s / max(p.result.chunks, 1)) / (r.proxy_cpu_s / max(r.result.chunks, 1))
                        for p, r in zip(runs[name], runs["relay"], strict=True)
                        if r.proxy_cpu_s > 0
                    )
                    if ratios:
                        summary[name]["relay_ratio_by_round"] = ratios
                        print(
                            f"{streams:>7} {name[:2] + '/re':>6} CPU per chunk, {name} / relay by round: median"
                            f" {statistics.median(ratios):.2f}x, range {ratios[0]:.2f}-{ratios[-1]:.2f}x"
                            f" ({len(ratios)} rounds)",
                            flush=True,
                        )
            report[str(streams)] = summary
    return report


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
    tracing = Tracing.from_env(
        "bench", lambda reason, n: metrics.spans_dropped.labels(reason).inc(n), exporter=NullExporter()
    )
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
    parser.add_argument(
        "--proxy-baseline", metavar="DIR", default=None,
        help="proxy benchmark: also run the proxy of this source tree (e.g. git archive <commit> | tar -x -C DIR)",
    )  # fmt: skip
    parser.add_argument(
        "--proxy-floor", action="store_true",
        help="proxy benchmark: also a zero-work TCP relay in front of the sim (benchmarks/tcp_relay.py)",
    )  # fmt: skip
    parser.add_argument(
        "--proxy-rounds", type=int, default=None, metavar="N",
        help="proxy benchmark: alternating rounds per stream count (default 3; --quick 2)",
    )  # fmt: skip
    parser.add_argument(
        "--pin", action="store_true",
        help="proxy benchmark: the proxy paths on the last CPU, the sim and the client on the others",
    )  # fmt: skip
    args = parser.parse_args(argv)
    seconds = 3.0 if args.quick else 10.0
    proxy_seconds, proxy_rounds = (3.0, 2) if args.quick else (15.0, 3)
    if args.proxy_rounds is not None:
        if args.proxy_rounds < 1:
            parser.error("--proxy-rounds must be at least 1")
        proxy_rounds = args.proxy_rounds
    print(f"# loadlens serving benchmarks ({os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M:%S')})")
    if args.only in (None, "capacity"):
        bench_capacity(
            [64, 256], seconds, [("tiny", "h100-sxm", 1.0), ("deepseek-r1-distill-llama-8b", "h100-sxm", 1.0)]
        )
    if args.only in (None, "proxy"):
        bench_proxy(
            [16, 64], proxy_seconds, proxy_rounds, "deepseek-r1-distill-llama-8b", "h100-sxm", args.proxy_baseline,
            args.proxy_floor, args.pin,
        )  # fmt: skip
    if args.only in (None, "instrumentation"):
        bench_instrumentation(20_000 if args.quick else 200_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
