"""Load-generator benchmark: measurement error and client cost of ``loadlens load`` against a reference client.

Run: ``python -m benchmarks.loadgen [--quick] [--streams 16,64,256] [--seconds 20] [--rounds 3]``.

Ground truth: a server with exact, known timings (the serving layer in front of ``ScriptedEngine``: 50 ms to
the first token, then one token every 10 ms, 128 tokens; ~256-token prompts), the same set-up as the peer
figures in shared/reference/load-testing.md (guidellm's mock server, 50/10 ms, 128 tokens). Its real timings
drift under load (asyncio sleeps wake late on a busy core), so the comparison that isolates the client is side
by side: a minimal raw-asyncio HTTP client (the reference) and ``loadlens load`` against the same server,
alternating, medians of ``--rounds`` rounds. The load generator and the reference are pinned to the same one
core, the server to the others, when the machine has more than one.

Reported per stream count: req/s, streamed output tok/s, TTFT and per-token ITL p50/p99, client CPU (share of
one core during the measured stage), output tokens per client CPU-second; then the differences to the
reference (the measurement error) and to the nominal 50/10 ms (server lateness included). The largest token
rate per loadgen core keeps |ITL p99 - reference| and |TTFT p99 - reference| within 1 ms.

guidellm is not installed here (it pulls torch and a tokenizer); its row is the peer figure measured on these
machines, quoted from the reference sheet and labelled so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loadlens.util.child import http_child
from loadlens.util.net import free_port

ROOT = Path(__file__).resolve().parents[1]
TTFT_S, ITL_S, OUTPUT_TOKENS, PROMPT_WORDS = 0.05, 0.01, 128, 256
PROMPT = " ".join(["the"] * PROMPT_WORDS)

# Peer figures measured on these machines (shared/reference/load-testing.md), 64 streams, 20 s, medians of 3.
GUIDELLM_PEER = {"streams": 64, "req_s": 35.2, "tok_s": 4683.0, "ttft_p50": 170.5, "itl_p50": 12.04, "cpu": 1.20}


@dataclass
class Run:
    client: str
    streams: int
    req_s: float
    tok_s: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    cpu: float  # share of one core during the measured window
    lag_p99: float  # how late the client's event loop wakes from 5 ms sleeps (its own timestamp delay), p99 ms

    @property
    def tok_per_cpu_s(self) -> float:
        return self.tok_s / self.cpu if self.cpu > 0 else float("nan")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


# --- the reference client (runs in its own process: --reference-client) ---------------------------------


async def _reference(host: str, port: int, streams: int, seconds: float) -> dict[str, Any]:
    body = json.dumps(
        {
            "model": "scripted",
            "prompt": PROMPT,
            "max_tokens": OUTPUT_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    ttft: list[float] = []
    itl: list[float] = []
    counts = {"tokens": 0, "requests": 0}
    window = [0.0, 0.0]

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, measure: bool) -> None:
        start = time.perf_counter()
        writer.write(head + body)
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # status line and headers
        last = None
        while True:
            line = await reader.readline()
            now = time.perf_counter()
            if not line:
                raise ConnectionError("server closed the stream")
            if line.startswith(b"data: [DONE]"):
                break
            if not line.startswith(b"data: {"):
                continue  # chunk-size lines and separators of the chunked body
            choices = json.loads(line[6:])["choices"]
            if not choices or not choices[0].get("text"):
                continue
            if measure and window[0] <= now < window[1]:
                counts["tokens"] += 1
                if last is None:
                    ttft.append(now - start)
                else:
                    itl.append(now - last)
            last = now
        while (await reader.readline()) != b"0\r\n":
            pass  # the rest of the chunked body
        await reader.readline()
        if measure and start >= window[0] and now < window[1]:
            counts["requests"] += 1

    lags: list[float] = []

    async def probe() -> None:
        # The same event-loop lag probe as loadlens: how late a 5 ms sleep wakes while the load runs.
        await barrier.event.wait()
        while time.perf_counter() < window[1]:
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(max(0.0, time.perf_counter() - t0 - 0.005))

    async def stream() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        await one(reader, writer, False)  # warm the connection and the server path
        await barrier.wait()
        while time.perf_counter() < window[1]:
            await one(reader, writer, True)
        writer.close()

    class Barrier:
        def __init__(self, n: int) -> None:
            self.n, self.event = n, asyncio.Event()

        async def wait(self) -> None:
            self.n -= 1
            if self.n == 0:
                window[0] = time.perf_counter()
                window[1] = window[0] + seconds
                self.cpu0 = time.process_time()
                self.event.set()
            await self.event.wait()

    barrier = Barrier(streams)
    await asyncio.gather(probe(), *(stream() for _ in range(streams)))
    cpu = time.process_time() - barrier.cpu0
    return {
        "req_s": counts["requests"] / seconds,
        "tok_s": counts["tokens"] / seconds,
        "ttft_p50": _pct(ttft, 0.5) * 1e3,
        "ttft_p99": _pct(ttft, 0.99) * 1e3,
        "itl_p50": _pct(itl, 0.5) * 1e3,
        "itl_p99": _pct(itl, 0.99) * 1e3,
        "cpu": cpu / (time.perf_counter() - window[0]),
        "lag_p99": _pct(lags, 0.99) * 1e3,
    }


def run_reference(url: str, streams: int, seconds: float, pin: str) -> Run:
    port = url.rsplit(":", 1)[1]
    cmd = [*pin.split(), sys.executable, "-m", "benchmarks.loadgen", "--reference-client", port, str(streams)]
    out = subprocess.run([*cmd, str(seconds)], cwd=ROOT, capture_output=True, text=True, timeout=seconds + 60)
    if out.returncode != 0:
        raise RuntimeError(f"reference client failed: {out.stderr[-2000:]}")
    return Run("reference", streams, **json.loads(out.stdout))


# --- loadlens load ---------------------------------------------------------------------------------------


def run_loadgen(url: str, streams: int, seconds: float, pin: str, workers: int = 0) -> Run:
    with tempfile.TemporaryDirectory(prefix="loadgen-bench-") as tmp:
        profile = Path(tmp) / "bench.yaml"
        profile.write_text(
            yaml.safe_dump(
                {
                    "version": 1,
                    "name": "bench",
                    "stop_timeout_s": 10,
                    "traffic": [
                        {
                            "name": "bench",
                            "weight": 1,
                            "endpoint": "completions",
                            "prompt": {"tokens": {"mean": PROMPT_WORDS}},
                            "output_tokens": {"mean": OUTPUT_TOKENS},
                        }
                    ],
                    "stages": [
                        {"name": "warmup", "warmup": True, "users": streams, "until_requests": streams},
                        {"name": "measure", "users": streams, "duration": seconds},
                    ],
                }
            )
        )
        cmd = [*pin.split(), sys.executable, "-m", "loadlens.cli", "load", "--profile", str(profile), "--host", url]
        cmd += ["--headless", "--results", tmp, "--run-id", "r", "--metrics-port", "0", "--progress-interval", "0"]
        if workers:
            cmd += ["--workers", str(workers)]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
        result = Path(tmp) / "r" / "benchmark_result.json"
        if out.returncode not in (0, 3) or not result.is_file():
            raise RuntimeError(f"loadlens load failed ({out.returncode}): {out.stdout[-2000:]}{out.stderr[-2000:]}")
        stage = json.loads(result.read_text())["stages"][1]
    return Run(
        "loadlens" if not workers else f"loadlens x{workers}",
        streams,
        req_s=stage["request_throughput"],
        tok_s=stage["delivered_output_throughput"],
        ttft_p50=stage["median_ttft_ms"],
        ttft_p99=stage["p99_ttft_ms"],
        itl_p50=stage["median_itl_ms"],
        itl_p99=stage["p99_itl_ms"],
        cpu=stage["loadgen_cpu_ratio"],
        lag_p99=stage["loadgen_loop_lag_p99_ms"],
    )


# --- server and orchestration ------------------------------------------------------------------------------


def scripted_server(pin: str) -> AbstractContextManager[str]:
    port = free_port()
    cmd = [*pin.split(), sys.executable, "-m", "tests.loadgen.scripted_server", "--port", str(port)]
    cmd += ["--ttft", str(TTFT_S), "--itl", str(ITL_S)]
    return http_child(cmd, port, cwd=ROOT)


def median_run(runs: Sequence[Run]) -> Run:
    def med(attr: str) -> float:
        return float(statistics.median(getattr(r, attr) for r in runs))

    fields = ("req_s", "tok_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "cpu", "lag_p99")
    return Run(runs[0].client, runs[0].streams, **{f: med(f) for f in fields})


def pinning() -> tuple[str, str, str]:
    """(client pin, server pin, description): client on the last allowed core, server on the others."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return "", "", "1 core: client and server share it"
    client, rest = cores[-1], cores[:-1]
    return (
        f"taskset -c {client}",
        f"taskset -c {','.join(map(str, rest))}",
        f"client pinned to core {client}, server to {rest}",
    )


def row(r: Run) -> str:
    return (
        f"{r.client:>12} {r.streams:>7} {r.req_s:>7.1f} {r.tok_s:>8.0f} {r.ttft_p50:>9.2f} {r.ttft_p99:>9.2f} "
        f"{r.itl_p50:>8.2f} {r.itl_p99:>8.2f} {r.cpu:>6.0%} {r.tok_per_cpu_s:>10.0f} {r.lag_p99:>8.2f}"
    )


HEADER = (
    f"{'client':>12} {'streams':>7} {'req/s':>7} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
    f"{'ITL p50':>8} {'ITL p99':>8} {'CPU':>6} {'tok/CPU-s':>10} {'lag p99':>8}"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 and 64 streams, 6 s, one round")
    parser.add_argument("--streams", default="16,64,128,256", help="comma-separated stream counts")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported")
    parser.add_argument("--workers", type=int, default=0, help="also run loadlens with N worker processes")
    parser.add_argument("--json", default=None, help="write every run and the summary here")
    parser.add_argument("--reference-client", nargs=3, metavar=("PORT", "STREAMS", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reference_client:
        port, streams, seconds = args.reference_client
        print(json.dumps(asyncio.run(_reference("127.0.0.1", int(port), int(streams), float(seconds)))))
        return 0
    streams_list = [16, 64] if args.quick else [int(s) for s in args.streams.split(",")]
    seconds = 6.0 if args.quick else args.seconds
    rounds = 1 if args.quick else args.rounds
    client_pin, server_pin, where = pinning()
    print(f"# loadlens load benchmark ({os.cpu_count()} CPUs, {where}; {time.strftime('%Y-%m-%d %H:%M:%S')})")
    print(f"server: ScriptedEngine TTFT {TTFT_S * 1e3:.0f} ms, ITL {ITL_S * 1e3:.0f} ms, {OUTPUT_TOKENS} tokens")
    print(f"{seconds:g} s per run, medians of {rounds} alternating rounds; latencies in ms\n")
    print(HEADER, flush=True)
    summary: dict[int, dict[str, Run]] = {}
    spread: dict[int, tuple[float, float]] = {}  # reference p99 TTFT / ITL: max - min over rounds
    every: list[dict[str, Any]] = []
    with scripted_server(server_pin) as url:
        for streams in streams_list:
            runs: dict[str, list[Run]] = {}
            for _ in range(rounds):
                for run in (
                    run_reference(url, streams, seconds, client_pin),
                    run_loadgen(url, streams, seconds, client_pin),
                    *([run_loadgen(url, streams, seconds, client_pin, args.workers)] if args.workers else []),
                ):
                    runs.setdefault(run.client, []).append(run)
                    every.append(run.__dict__)
            summary[streams] = {name: median_run(rs) for name, rs in runs.items()}
            ref_runs = runs["reference"]
            spread[streams] = (
                max(r.ttft_p99 for r in ref_runs) - min(r.ttft_p99 for r in ref_runs),
                max(r.itl_p99 for r in ref_runs) - min(r.itl_p99 for r in ref_runs),
            )
            for r in summary[streams].values():
                print(row(r), flush=True)
    g = GUIDELLM_PEER
    print(
        f"{'guidellm*':>12} {g['streams']:>7} {g['req_s']:>7.1f} {g['tok_s']:>8.0f} {g['ttft_p50']:>9.2f} "
        f"{'':>9} {g['itl_p50']:>8.2f} {'':>8} {g['cpu']:>6.0%} {g['tok_s'] / g['cpu']:>10.0f} {'':>8}"
    )
    print("  * guidellm 0.8.1: peer figure from shared/reference/load-testing.md (not installed here)\n")

    print("Measurement error of loadlens vs the reference client (ms; + = loadlens later) and vs nominal 50/10 ms")
    print(f"{'streams':>7} {'dTTFT p50':>10} {'dTTFT p99':>10} {'dITL p50':>9} {'dITL p99':>9} {'d tok/s':>8}", end="")
    print(f" {'TTFT p50-50':>12} {'ITL p50-10':>11} {'ref p99 noise TTFT/ITL':>23}")
    best_rate = best_lag_rate = 0.0
    for streams, medians in summary.items():
        ref, lg = medians["reference"], medians["loadlens"]
        d = (lg.ttft_p50 - ref.ttft_p50, lg.ttft_p99 - ref.ttft_p99, lg.itl_p50 - ref.itl_p50, lg.itl_p99 - ref.itl_p99)
        print(
            f"{streams:>7} {d[0]:>+10.2f} {d[1]:>+10.2f} {d[2]:>+9.3f} {d[3]:>+9.3f} {lg.tok_s / ref.tok_s - 1:>+8.1%}"
            f" {lg.ttft_p50 - TTFT_S * 1e3:>+12.2f} {lg.itl_p50 - ITL_S * 1e3:>+11.3f}"
            f" {spread[streams][0]:>14.2f} / {spread[streams][1]:<6.2f}"
        )
        if abs(d[1]) <= 1.0 and abs(d[3]) <= 1.0:
            best_rate = max(best_rate, lg.tok_s)
        if lg.lag_p99 <= 1.0:
            best_lag_rate = max(best_lag_rate, lg.tok_s)
    print("(ref p99 noise: how much the reference's own p99 moved between rounds; smaller differences are noise)")
    print(
        f"\nlargest streamed rate, one loadgen core, |p99 difference to the reference| <= 1 ms: {best_rate:.0f} tok/s"
    )
    print(f"largest streamed rate, one loadgen core, loadgen event-loop lag p99 <= 1 ms: {best_lag_rate:.0f} tok/s")

    if 64 in summary:
        ref, lg = summary[64]["reference"], summary[64]["loadlens"]
        guidellm_eff = g["tok_s"] / g["cpu"]
        goals = [
            ("throughput within 2 % of the reference", abs(lg.tok_s / ref.tok_s - 1) <= 0.02),
            ("at most 25 % of one core", lg.cpu <= 0.25),
            ("median TTFT within 2 ms of the reference", abs(lg.ttft_p50 - ref.ttft_p50) <= 2.0),
            ("median ITL within 0.2 ms of the reference", abs(lg.itl_p50 - ref.itl_p50) <= 0.2),
            ("at least 4x guidellm's tokens per CPU-second", lg.tok_per_cpu_s >= 4 * guidellm_eff),
        ]
        print("\nGoals at 64 streams:")
        for text, ok in goals:
            print(f"  [{'met' if ok else 'MISSED'}] {text}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"runs": every, "medians": {s: {k: v.__dict__ for k, v in r.items()} for s, r in summary.items()}}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
