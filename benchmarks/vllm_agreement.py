"""TTFT and ITL of the same requests as the client, the proxy and vLLM each measure them, side by side.

Run: ``python -m benchmarks.vllm_agreement [--requests N] [--concurrency C] [--max-tokens T]`` (needs
``.venv-vllm``, docs/real-vllm.md).

It starts one real vLLM (its CPU build, the tiny model of ``tests/support/vllm_model.py``) and
``loadlens serve --engine openai`` in front of it, reads both ``/metrics``, sends N streamed completions
through the proxy from C closed-loop clients on bare sockets (about 10 prompt tokens, T output tokens,
``ignore_eos``, greedy), reads both ``/metrics`` again and prints, for TTFT and ITL, the count, mean and p99 of:

- the **client**: TTFT from writing the request to the first read carrying a token; ITL the gaps between the
  reads that carried tokens (raw samples: exact mean and p99);
- the **proxy**: ``gen_ai_server_time_to_first_token_seconds`` (arrival at the proxy to the first upstream
  read carrying a token) and ``loadlens_inter_token_latency_seconds`` (gaps between those reads);
- **vLLM**: ``vllm:time_to_first_token_seconds`` (arrival in vLLM's API server to the first token's output
  processing) and ``vllm:inter_token_latency_seconds`` (gaps between the engine steps that made a token).

Histogram means are exact (``_sum / _count`` of the run's increase); p99 from buckets is at bucket
resolution (linear within the bucket, as Prometheus' ``histogram_quantile``). Why the figures differ, each by
its definition, is in BENCHMARKS.md (*Client, proxy and vLLM timing agreement*). :func:`measure` is what
``tests/vllm/test_timing_agreement.py`` runs against the test session's server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

SERIES = {
    "proxy": ("gen_ai_server_time_to_first_token_seconds", "loadlens_inter_token_latency_seconds"),
    "vllm": ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"),
}
_FRAME = re.compile(rb"data: (\{.*?\})\n\n")


@dataclass(frozen=True)
class Histogram:
    """One histogram family summed over its label sets: cumulative bucket counts by upper bound, sum, count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, before: Histogram) -> Histogram:
        earlier = dict(before.buckets)
        return Histogram(
            tuple((le, n - earlier.get(le, 0.0)) for le, n in self.buckets),
            self.sum - before.sum,
            self.count - before.count,
        )

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """Prometheus' ``histogram_quantile``: linear within the bucket holding rank ``q * count``."""
        if not self.count:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank:
                if math.isinf(le):
                    return lower  # in the +Inf bucket: the highest finite bound, as Prometheus answers
                return lower + (le - lower) * (rank - below) / (n - below) if n > below else le
            lower, below = le, n
        return lower


def histogram(text: str, name: str) -> Histogram:
    """The family ``name`` (without ``_bucket``/``_sum``/``_count``) of an exposition, summed over labels."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == name + "_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == name + "_sum":
                total += sample.value
            elif sample.name == name + "_count":
                count += sample.value
    return Histogram(tuple(sorted(buckets.items())), total, count)


@dataclass(frozen=True)
class Figures:
    """Count, mean and p99 (seconds) of one measure."""

    count: int
    mean: float
    p99: float

    @classmethod
    def of_samples(cls, samples: Sequence[float]) -> Figures:
        ordered = sorted(samples)
        p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] if ordered else math.nan
        return cls(len(ordered), sum(ordered) / len(ordered) if ordered else math.nan, p99)

    @classmethod
    def of_histogram(cls, h: Histogram) -> Figures:
        return cls(round(h.count), h.mean, h.quantile(0.99))


@dataclass(frozen=True)
class Agreement:
    """TTFT and ITL figures by source (client, proxy, vllm), the request count and output tokens each."""

    ttft: dict[str, Figures]
    itl: dict[str, Figures]
    requests: int
    max_tokens: int
    proxy_itl_sum: float
    vllm_itl_sum: float

    def table(self) -> str:
        rows = [
            "| measure | source | count | mean (ms) | p99 (ms) |",
            "|---|---|---:|---:|---:|",
        ]
        for measure, figures in (("TTFT", self.ttft), ("ITL", self.itl)):
            for source in ("client", "proxy", "vllm"):
                f = figures[source]
                rows.append(f"| {measure} | {source} | {f.count} | {f.mean * 1e3:.2f} | {f.p99 * 1e3:.2f} |")
        return "\n".join(rows)


@dataclass
class _Request:
    sent: float = 0.0
    reads: list[float] | None = None  # times of the reads that carried a token
    completion_tokens: int = 0


async def _one(host: str, port: int, payload: bytes) -> _Request:
    """One streamed completion on its own connection (opened before the clock starts)."""
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    request = _Request(reads=[])
    buffer = b""
    try:
        request.sent = time.monotonic()
        writer.write(head + payload)
        while data := await reader.read(65536):
            now = time.monotonic()
            buffer += data
            carried = False
            end = 0
            for match in _FRAME.finditer(buffer):
                end = match.end()
                chunk = json.loads(match.group(1))
                choices = chunk.get("choices") or []
                if choices and choices[0].get("text"):
                    carried = True
                if not choices and isinstance(chunk.get("usage"), dict):
                    request.completion_tokens = int(chunk["usage"]["completion_tokens"])
            buffer = buffer[end:]
            if carried:
                request.reads.append(now)  # type: ignore[union-attr]
    finally:
        writer.close()
    return request


async def _drive(url: str, model: str, requests: int, concurrency: int, max_tokens: int) -> list[_Request]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    done: list[_Request] = []
    counter = iter(range(requests))

    async def user() -> None:
        for i in counter:
            body = {
                "model": model,
                "prompt": f"Request {i} of the agreement run:",
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            done.append(await _one(host, port, json.dumps(body).encode()))

    await asyncio.gather(*(user() for _ in range(concurrency)))
    return done


def _scrape(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=30).text


def measure(
    proxy_url: str, vllm_url: str, model: str, *, requests: int, concurrency: int, max_tokens: int
) -> Agreement:
    """Drive ``requests`` streamed completions through the proxy at ``proxy_url`` (in front of the vLLM at
    ``vllm_url``, which nothing else may use meanwhile) and read the three sides' figures. vLLM records a
    request's figures as its outputs are processed, possibly after the client has read its last byte: its
    ``/metrics`` is read again until every request's TTFT and ITL are in (at most 30 s)."""
    before = {side: _scrape(url) for side, url in (("proxy", proxy_url), ("vllm", vllm_url))}
    done = asyncio.run(_drive(proxy_url, model, requests, concurrency, max_tokens))
    tokens = sum(r.completion_tokens for r in done)
    deadline = time.monotonic() + 30
    while True:
        after = {side: _scrape(url) for side, url in (("proxy", proxy_url), ("vllm", vllm_url))}
        delta = {
            side: [histogram(after[side], name).minus(histogram(before[side], name)) for name in SERIES[side]]
            for side in SERIES
        }
        settled = delta["vllm"][0].count >= requests and delta["vllm"][1].count >= tokens - requests
        if settled and delta["proxy"][0].count >= requests or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    client_ttft = [r.reads[0] - r.sent for r in done if r.reads]
    client_itl = [b - a for r in done if r.reads for a, b in zip(r.reads, r.reads[1:], strict=False)]
    return Agreement(
        ttft={
            "client": Figures.of_samples(client_ttft),
            "proxy": Figures.of_histogram(delta["proxy"][0]),
            "vllm": Figures.of_histogram(delta["vllm"][0]),
        },
        itl={
            "client": Figures.of_samples(client_itl),
            "proxy": Figures.of_histogram(delta["proxy"][1]),
            "vllm": Figures.of_histogram(delta["vllm"][1]),
        },
        requests=len(done),
        max_tokens=max_tokens,
        proxy_itl_sum=delta["proxy"][1].sum,
        vllm_itl_sum=delta["vllm"][1].sum,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm_agreement", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1 or args.max_tokens < 2:
        parser.error("--requests and --concurrency must be >= 1, --max-tokens >= 2")

    from loadlens.util.child import http_child_process
    from loadlens.util.net import free_port
    from tests.support import vllm_server as rig
    from tests.support.vllm_model import SERVED_NAME, tiny_model

    if rig.python() is None:
        print(f"vLLM's CPU build is not installed at {rig.venv()}: make vllm-env", file=sys.stderr)
        return 2
    log = Path(tempfile.mkdtemp(prefix="vllm-agreement-")) / "vllm.log"
    with rig.vllm_server(tiny_model(), log_path=log) as server:
        port = free_port()
        argv_proxy = [sys.executable, "-m", "loadlens.cli", "serve", "--engine", "openai", "--upstream", server.url,
                      "--upstream-kind", "vllm", "--port", str(port), "--log-level", "warning"]  # fmt: skip
        with http_child_process(argv_proxy, port, timeout_s=60) as proxy:
            # One request each way first: vLLM's first request compiles and warms its caches.
            measure(proxy.url, server.url, SERVED_NAME, requests=2, concurrency=1, max_tokens=args.max_tokens)
            result = measure(
                proxy.url,
                server.url,
                SERVED_NAME,
                requests=args.requests,
                concurrency=args.concurrency,
                max_tokens=args.max_tokens,
            )
    print(
        f"{result.requests} streamed completions through the proxy, {args.concurrency} at a time, "
        f"{result.max_tokens} output tokens each; load average {os.getloadavg()[0]:.2f} (1 min)"
    )
    print(result.table())
    print(f"ITL sums (s): proxy {result.proxy_itl_sum:.3f}, vLLM {result.vllm_itl_sum:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
