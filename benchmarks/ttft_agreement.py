"""Client, ``gen_ai_server_*`` and ``vllm:*`` mean TTFT of ``loadlens serve --engine sim``, side by side.

Run: ``python -m benchmarks.ttft_agreement [--model-profile M] [--streams S] [--seconds T]``.

It starts ``loadlens serve --engine sim`` in its own process and drives it with S closed-loop streaming
clients on bare sockets (one connection per request, opened before the clock starts, so the client's own
overhead is a few microseconds of writing and reading). Each request is a completion of about 60 prompt tokens
and 64 output tokens (``ignore_eos``). At the end it reads ``/metrics`` and prints the three mean TTFTs, how
far the server's are from the client's, and the sim's timing figures (late steps, schedule restarts, mean
wake-up lateness), so a lagging sim is visible next to the latencies it reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Sequence

import httpx

from loadlens.util.child import http_child
from loadlens.util.net import free_port

FIRST_TEXT = re.compile(rb'"text":"[^"]')


async def _one(port: int, payload: bytes) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    sent = time.monotonic()
    writer.write(head.encode() + payload)
    received = b""
    first: float | None = None
    try:
        while chunk := await reader.read(65536):
            received += chunk
            if first is None and FIRST_TEXT.search(received):
                first = time.monotonic()
    finally:
        writer.close()
    if first is None:
        raise RuntimeError(f"no token in the response: {received[:300]!r}")
    return first - sent


async def _drive(port: int, model: str, streams: int, seconds: float) -> list[float]:
    stop = time.monotonic() + seconds
    ttfts: list[float] = []

    async def user(n: int) -> None:
        i = 0
        while time.monotonic() < stop:
            body = {"model": model, "prompt": f"hello {n} {i} " * 20, "max_tokens": 64, "stream": True,
                    "ignore_eos": True}  # fmt: skip
            ttfts.append(await _one(port, json.dumps(body).encode()))
            i += 1

    await asyncio.gather(*(user(n) for n in range(streams)))
    return ttfts


def _total(metrics: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model-profile", default="tiny")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args(argv)
    port = free_port()
    cmd = [sys.executable, "-m", "loadlens.cli", "serve", "--engine", "sim", "--model-profile", args.model_profile,
           "--port", str(port), "--log-level", "warning"]  # fmt: skip
    with http_child(cmd, port) as url:
        ttfts = asyncio.run(_drive(port, args.model_profile, args.streams, args.seconds))
        metrics = httpx.get(url + "/metrics", timeout=10).text
    client = sum(ttfts) / len(ttfts)
    gen_ai = _total(metrics, "gen_ai_server_time_to_first_token_seconds_sum") / _total(
        metrics, "gen_ai_server_time_to_first_token_seconds_count"
    )
    vllm = _total(metrics, "vllm:time_to_first_token_seconds_sum") / _total(
        metrics, "vllm:time_to_first_token_seconds_count"
    )
    steps = _total(metrics, "loadlens_sim_timing_error_seconds_count")
    print(f"{args.model_profile}, {args.streams} streams, {len(ttfts)} requests in {args.seconds:.0f} s")
    print(f"  mean TTFT  client {client * 1e3:8.2f} ms   gen_ai {gen_ai * 1e3:8.2f} ms ({gen_ai / client - 1:+.2%})"
          f"   vllm {vllm * 1e3:8.2f} ms ({vllm / client - 1:+.2%})")  # fmt: skip
    print(f"  sim: {_total(metrics, 'loadlens_sim_late_steps_total'):.0f} of {steps:.0f} steps late (> 2 ms), "
          f"{_total(metrics, 'loadlens_sim_schedule_slips_total'):.0f} schedule restarts, mean wake-up lateness "
          f"{_total(metrics, 'loadlens_sim_timing_error_seconds_sum') / max(steps, 1) * 1e3:.2f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
