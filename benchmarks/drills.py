"""Reliability drills against real ``loadlens serve`` processes, direct and through the ``openai`` proxy.

Run: ``python -m benchmarks.drills [--quick] [--only NAME ...]`` (``make reliability``; ``make bench`` runs it
too). Each drill prints its figures and a verdict line; the exit status is 1 when any verdict fails.

1. ``disconnects``: N streaming requests each read a few token chunks and then drop the connection, C at a
   time, against a sim server and through a proxy in front of another one. Afterwards (when the servers have
   settled, at most 10 s) nothing may be left: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
   the sim's ``vllm:kv_cache_usage_perc`` (KV blocks held) and every server's ``loadlens_requests_in_flight``
   must all be 0.
2. ``overload``: 10x more closed-loop clients than the sim admits (``max_num_seqs`` running plus
   ``max_waiting`` queued), for D seconds, direct and through the proxy. Only 200 and 429 may come back, every
   429 with ``Retry-After``; the server's RSS growth over the storm is reported; ``/health`` must answer 200
   5 s after the storm.
3. ``otlp_down``: sim servers side by side, one tracing to a live OTLP receiver, one tracing to an endpoint
   that refuses connections (and one without tracing, for scale); alternating rounds of the same load. The
   request p99 (client e2e) with the endpoint down must stay within noise of the live one (ratio reported;
   verdict at 1.25x, 2x for the quick variant's few hundred requests), every request must answer 200 and the
   lost spans must be counted (``loadlens_trace_spans_dropped_total`` > 0).
4. ``restarts``: the local stack (real Prometheus, Alertmanager, pager) with 10 s latency windows; a TTFT
   breach on the sim (300 ms of host time on every admitting step); Alertmanager and then Prometheus are
   restarted (SIGTERM, same data directories) while the alert is pending, and Alertmanager again while it
   fires. The page must still arrive and, after the load stops, its resolution. Firing notifications are
   counted (a repeat is a re-notification, not a loss).

The quick variants (CI) use small numbers. ``--invariants-only`` (the CI test) judges only counts and status
codes; ``otlp_down``'s p99 ratio is then printed, not judged (a stall doubles a p99 of a few hundred requests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import httpx
import yaml

from benchmarks.drill_probes import count_reaches, scrape, settled, wait_for
from loadlens.contracts.slo import DEFAULT_SLO_FILE
from loadlens.stack.runner import Stack, StackOptions
from loadlens.util.child import Child, http_child_process
from loadlens.util.net import free_port

BODY_PROMPT = "drill prompt " * 16


Server = Child  # url and pid of a running `loadlens serve`


def serve(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60.0) -> AbstractContextManager[Child]:
    """A ``loadlens serve`` child on a free port until the block ends (SIGTERM, then SIGKILL)."""
    port = free_port()
    cmd = [sys.executable, "-m", "loadlens.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    return http_child_process(cmd, port, timeout_s=timeout_s, env=env)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _body(max_tokens: int) -> dict[str, object]:
    return {"model": "tiny", "prompt": BODY_PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}


# --- 1. disconnects -------------------------------------------------------------------------------------------

LEAK_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


async def _disconnect_storm(url: str, n: int, concurrency: int, read_chunks: int) -> Counter[str]:
    outcome: Counter[str] = Counter()
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def one(i: int) -> None:
            async with gate:
                # Far more tokens than a client reads before it leaves: no stream can finish first, however slow
                # the client (the tiny model's 2,048-token context, less the prompt).
                response = await session.post(url + "/v1/completions", json=_body(1900))
                try:
                    if response.status != 200:
                        outcome[f"status_{response.status}"] += 1
                        return
                    seen = 0
                    async for line in response.content:
                        if line.startswith(b"data: {"):
                            seen += 1
                            if seen >= read_chunks + (i % 3):  # vary where in the stream the client leaves
                                break
                    outcome["dropped_mid_stream" if seen else "no_tokens"] += 1
                finally:
                    response.close()  # drops the connection: the server sees a disconnect

        await asyncio.gather(*(one(i) for i in range(n)))
    return outcome


def drill_disconnects(quick: bool) -> bool:
    n, concurrency = (200, 16) if quick else (1000, 64)
    ok = True
    with (
        serve("--speed", "4") as direct,
        serve("--speed", "4") as upstream,
        serve("--engine", "openai", "--upstream", upstream.url) as proxy,
    ):
        for label, target, watched in (
            ("direct", direct.url, [direct.url]),
            ("proxy", proxy.url, [proxy.url, upstream.url]),
        ):
            started = time.perf_counter()
            outcome = asyncio.run(_disconnect_storm(target, n, concurrency, read_chunks=2))
            seconds = time.perf_counter() - started
            left = settled(watched, (*LEAK_SERIES, "loadlens_requests_in_flight"))
            leaked = {
                f"{'proxy' if u == proxy.url else 'sim'}:{k}": v for u, f in left.items() for k, v in f.items() if v
            }
            # Not vacuous: the sim must export every watched series, the proxy its in-flight gauge.
            expected = {u: ["loadlens_requests_in_flight"] if u == proxy.url else [*LEAK_SERIES] for u in watched}
            absent = [f"{u}:{k}" for u, names in expected.items() for k in names if k not in left[u]]
            # The abort is counted as the disconnect's handling ends, which can trail the in-flight gauge.
            aborts = count_reaches(watched[0], "loadlens_request_aborts_total", n)
            good = outcome["dropped_mid_stream"] == n and not leaked and not absent and aborts == n
            ok &= good
            print(
                f"disconnects {label}: {n} streams, {concurrency} at a time, {seconds:.1f} s: "
                f"{dict(outcome)}; the server it reached counted {aborts:.0f} aborts; "
                f"left behind: {leaked or 'nothing'}"
                f"{f'; series absent: {absent}' if absent else ''} "
                f"-> {'PASS' if good else 'FAIL'}",
                flush=True,
            )
    return ok


# --- 2. overload ----------------------------------------------------------------------------------------------


@dataclass
class StormResult:
    codes: Counter[int] = field(default_factory=Counter)
    missing_retry_after: int = 0
    errors: Counter[str] = field(default_factory=Counter)


async def _overload(url: str, clients: int, seconds: float) -> StormResult:
    out = StormResult()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        stop_at = time.monotonic() + seconds

        async def client() -> None:
            while time.monotonic() < stop_at:
                try:
                    async with session.post(url + "/v1/completions", json=_body(32)) as response:
                        await response.read()
                        out.codes[response.status] += 1
                        if response.status == 429 and "Retry-After" not in response.headers:
                            out.missing_retry_after += 1
                        if response.status == 429:
                            await asyncio.sleep(0.05)  # a client that backs off a little, as the header asks
                except (aiohttp.ClientError, TimeoutError) as err:
                    out.errors[type(err).__name__] += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return out


def drill_overload(quick: bool) -> bool:
    seqs, waiting = (4, 4) if quick else (16, 16)
    clients, seconds = 10 * (seqs + waiting), (3.0 if quick else 20.0)
    knobs = ("--knob", f"max_num_seqs={seqs}", "--knob", f"max_waiting={waiting}")
    ok = True
    with (
        serve("--speed", "4", *knobs) as direct,
        serve("--speed", "4", *knobs) as upstream,
        serve("--engine", "openai", "--upstream", upstream.url) as proxy,
    ):
        for label, target in (("direct", direct), ("proxy", proxy)):
            asyncio.run(_overload(target.url, seqs, 1.0))  # warm the code paths before the RSS baseline
            rss0 = rss_bytes(target.pid)
            result = asyncio.run(_overload(target.url, clients, seconds))
            rss1 = rss_bytes(target.pid)
            time.sleep(5.0)
            healthy = httpx.get(target.url + "/health", timeout=5).status_code == 200
            bad = {c: k for c, k in result.codes.items() if c not in (200, 429)}
            good = not bad and not result.errors and result.missing_retry_after == 0 and healthy
            good &= result.codes[200] > 0 and result.codes[429] > 0
            ok &= good
            print(
                f"overload {label}: {clients} clients for {seconds:.0f} s against max_num_seqs={seqs} "
                f"max_waiting={waiting}: codes {dict(sorted(result.codes.items()))}, 429 without Retry-After "
                f"{result.missing_retry_after}, client errors {dict(result.errors) or 0}; RSS "
                f"{rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB ({(rss1 - rss0) / 2**20:+.1f}); /health 5 s "
                f"after: {'200' if healthy else 'not 200'} -> {'PASS' if good else 'FAIL'}",
                flush=True,
            )
    return ok


# --- 3. OTLP endpoint down -------------------------------------------------------------------------------------


async def _e2e(url: str, streams: int, seconds: float) -> tuple[list[float], int]:
    """The E2E latency of every request answered 200, and how many were not."""
    latencies: list[float] = []
    not_ok = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        stop_at = time.monotonic() + seconds

        async def user() -> None:
            nonlocal not_ok
            while time.monotonic() < stop_at:
                start = time.perf_counter()
                async with session.post(url + "/v1/completions", json=_body(16)) as response:
                    await response.read()
                    if response.status == 200:
                        latencies.append(time.perf_counter() - start)
                    else:
                        not_ok += 1

        await asyncio.gather(*(user() for _ in range(streams)))
    return latencies, not_ok


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


class _OtlpSink(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that accepts every export: an empty protobuf ExportTraceServiceResponse."""

    received = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).received += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


@contextmanager
def otlp_sink() -> Iterator[tuple[str, type[_OtlpSink]]]:
    handler = type("Sink", (_OtlpSink,), {"received": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def drill_otlp_down(quick: bool, judge_timing: bool = True) -> bool:
    """Tracing to a live collector against tracing to a dead endpoint, side by side: the difference is what an
    outage of the collector costs the requests (tracing's own cost is the same on both sides). Tracing off is
    measured too, for scale. ``judge_timing=False``: the p99 ratio is reported, not judged."""
    rounds, seconds, streams = (2, 2.0, 8) if quick else (5, 5.0, 16)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    off_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "", "OTEL_TRACES_EXPORTER": ""}
    with otlp_sink() as (live, sink):
        envs = {
            "off": off_env,
            "up": {"OTEL_EXPORTER_OTLP_ENDPOINT": live, "OTEL_TRACES_EXPORTER": "otlp"},
            "down": {"OTEL_EXPORTER_OTLP_ENDPOINT": dead, "OTEL_TRACES_EXPORTER": "otlp"},
        }
        with (
            serve("--speed", "4", env=envs["off"]) as off,
            serve("--speed", "4", env=envs["up"]) as up,
            serve("--speed", "4", env=envs["down"]) as down,
        ):
            servers = {"off": off, "up": up, "down": down}
            p99: dict[str, list[float]] = {label: [] for label in servers}
            not_ok = 0
            for _ in range(rounds):
                for label, server in servers.items():
                    latencies, failed = asyncio.run(_e2e(server.url, streams, seconds))
                    p99[label].append(_p99(latencies))
                    not_ok += failed
            time.sleep(6.0)  # the exporter's batch delay and its retries give up: drops are counted
            # On a loaded machine the first export can take longer to give up: a polling deadline, not a figure.
            wait_for(lambda: scrape(down.url).get("loadlens_trace_spans_dropped_total", 0.0) > 0, 30)
            dropped = scrape(down.url).get("loadlens_trace_spans_dropped_total", 0.0)
            dropped_up = scrape(up.url).get("loadlens_trace_spans_dropped_total", 0.0)
            exports = sink.received
    ms = {label: statistics.median(values) * 1e3 for label, values in p99.items()}
    ratio = ms["down"] / ms["up"]
    limit = 2.0 if quick else 1.25  # the quick rounds are a few hundred requests: their p99 is noise-bound
    good = (ratio <= limit or not judge_timing) and not_ok == 0 and dropped > 0 and exports > 0
    judged = f"down/up <= {limit}, " if judge_timing else "down/up not judged, "
    print(
        f"otlp_down: {rounds} alternating rounds of {streams} streams x {seconds:.0f} s; request p99 median: "
        f"collector up {ms['up']:.1f} ms, endpoint down {ms['down']:.1f} ms (x{ratio:.3f}), tracing off "
        f"{ms['off']:.1f} ms; {not_ok} requests not answered 200; spans dropped and counted with the endpoint "
        f"down: {dropped:.0f} (collector up: {dropped_up:.0f}, {exports} exports received) (verdict: {judged}"
        f"all 200, drops > 0) -> {'PASS' if good else 'FAIL'}",
        flush=True,
    )
    return good


# --- 4. Prometheus and Alertmanager restarted mid-run ---------------------------------------------------------

PAGE_ALERT = "LoadlensTTFTP99High"


def _stack(run_dir: Path) -> Stack:
    slo = yaml.safe_load(DEFAULT_SLO_FILE.read_text())
    # Short windows so the drill takes a minute (the packaged file uses 1m windows and 1m "for").
    slo["alerting"].update({"latency_window": "10s", "latency_for": "5s", "min_request_rate": 0.1})
    slo_file = run_dir / "slos.yaml"
    run_dir.mkdir(parents=True, exist_ok=True)
    slo_file.write_text(yaml.safe_dump(slo))
    options = StackOptions(
        run_dir=run_dir / "stack",
        **{f"{name}_port": free_port() for name in ("serve", "gpu", "pager", "loadgen", "training")},
        prometheus_port=free_port(),
        alertmanager_port=free_port(),
        model_profile="tiny",
        gpu_profile="h100-sxm",
        knobs=["max_waiting=1000"],
        slo_file=slo_file,
        scrape_interval="1s",
    )
    return Stack(options, say=lambda _: None)


def _notifications(stack: Stack, status: str) -> int:
    path = stack.run_dir / "pages.jsonl"
    if not path.exists():
        return 0
    count = 0
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        count += any(a["labels"]["alertname"] == PAGE_ALERT and a["status"] == status for a in doc["alerts"])
    return count


def _prometheus_state(prom: str) -> str:
    try:
        alerts = httpx.get(prom + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    except (httpx.HTTPError, ValueError, KeyError):
        return "unreachable"
    states = {a["state"] for a in alerts if a["labels"].get("alertname") == PAGE_ALERT}
    return "firing" if "firing" in states else ("pending" if "pending" in states else "inactive")


def drill_restarts(quick: bool) -> bool:
    """Drill 4 of the module docstring: the page and its resolution survive restarts of both."""
    if shutil.which("prometheus") is None or not (
        shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    ):
        print("restarts: FAIL (prometheus or alertmanager not installed: apt-get install prometheus "
              "prometheus-alertmanager)", flush=True)  # fmt: skip
        return False
    with tempfile.TemporaryDirectory(prefix="loadlens-drill-") as tmp:
        stack = _stack(Path(tmp))
        stack.up()
        try:
            urls = {s.name: s.url for s in stack._load()}
            prom, serve_url = urls["prometheus"], urls["serve"]
            discovered = wait_for(
                lambda: bool(httpx.get(prom + "/api/v1/alertmanagers").json()["data"]["activeAlertmanagers"]), 30
            )
            if discovered is None:
                print("restarts: FAIL (Prometheus never discovered Alertmanager)", flush=True)
                return False
            # The breach is the server's own: every admitting step costs 300 ms, so every first token it observes
            # is late whatever the drill's client manages (a queue behind one slot made the server's TTFT hang on
            # the client keeping the queue full, which a starved client does not).
            knob = {"insertion_overhead_us": 300_000}
            assert httpx.patch(serve_url + "/admin/knobs", json=knob).status_code == 200
            stop = threading.Event()
            load = threading.Thread(target=_breach, args=(serve_url, 12, stop), daemon=True)
            breach_started = time.monotonic()
            load.start()
            try:
                pending = wait_for(lambda: _prometheus_state(prom) in ("pending", "firing"), 60)
                state_at_restart = _prometheus_state(prom)
                stack.restart("alertmanager")
                stack.restart("prometheus")
                paged = wait_for(lambda: _notifications(stack, "firing") > 0, 90)
                page_s = None if paged is None else time.monotonic() - breach_started
                stack.restart("alertmanager")  # while firing: the resolution must not be lost
                time.sleep(3.0)
            finally:
                stop.set()
                load.join(60)
            resolved = wait_for(lambda: _notifications(stack, "resolved") > 0, 90)
            firing_pages = _notifications(stack, "firing")
        finally:
            stack.down()
    good = pending is not None and paged is not None and resolved is not None
    print(
        f"restarts: TTFT breach; {PAGE_ALERT} {state_at_restart if pending is not None else 'never pending'} when "
        f"Alertmanager then Prometheus restarted; paged {f'{page_s:.1f} s' if page_s is not None else 'never'} "
        f"after the breach began; Alertmanager restarted again while firing; resolution "
        f"{f'{resolved:.1f} s after the load stopped' if resolved is not None else 'never'}; firing "
        f"notifications {firing_pages} (repeats are re-notifications, not lost pages) -> {'PASS' if good else 'FAIL'}",
        flush=True,
    )
    return good


def _breach(url: str, streams: int, stop: threading.Event) -> None:
    async def run() -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

            async def user() -> None:
                while not stop.is_set():
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        async with session.post(url + "/v1/completions", json=_body(32)) as response:
                            await response.read()

            await asyncio.gather(*(user() for _ in range(streams)))

    asyncio.run(run())


DRILLS = {
    "disconnects": drill_disconnects,
    "overload": drill_overload,
    "otlp_down": drill_otlp_down,
    "restarts": drill_restarts,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.drills", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small numbers (CI)")
    parser.add_argument("--only", nargs="+", choices=sorted(DRILLS), default=None, help="run only these drills")
    parser.add_argument(
        "--invariants-only", action="store_true", help="judge counts and status codes only, not timing figures (CI)"
    )
    args, _ = parser.parse_known_args(argv)
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; quick={args.quick}", flush=True)

    def run(name: str) -> bool:
        if name == "otlp_down":
            return drill_otlp_down(args.quick, judge_timing=not args.invariants_only)
        return DRILLS[name](args.quick)

    failed = [name for name in args.only or DRILLS if not run(name)]
    if failed:
        print(f"drills failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
