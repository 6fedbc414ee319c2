"""GPU exporter benchmark: scrape latency and sampler CPU with 8 simulated GPUs x 64 processes.

Goals (issue 3): scrape p99 <= 5 ms; the sampler at 10 Hz costs <= 1 % of one core.

    python -m benchmarks.gpu_exporter            # ~35 s
    python -m benchmarks.gpu_exporter --quick    # ~12 s
    python -m benchmarks.gpu_exporter --json out.json

Cases:
- scrape (in process): what /metrics serves (every default collector, the fast text encoder). Window
  statistics are the sampler's work (recomputed at most once a second), so they count under sampler CPU.
  Since issue 24 the collectors run in the sampler's pass too and the scrape serves its result;
  ``benchmarks/gpu_scrape.py`` compares that with reads at scrape time in one run.
- scrape (HTTP): GET /metrics on the exporter's own server over a kept-alive connection.
- sampler CPU: the sampler thread at 10 Hz for a fixed wall time; CPU is this process's, with the simulated
  engine in a separate process serving ``/sim/device-state?since_us=N`` with fresh samples (the real sim
  path: HTTP GET + JSON parse every tick) - and, as a lower bound, over a static file.

Two sample rates: a real H100's native 1/6 s, and 10 ms (what the simulator needs to show the guide's 29 ms
swing period), both over the default 30 s window. Defaults as the CLI's: the sim document is fetched every
0.5 s (--sim-refresh), window statistics recomputed every 1 s (--stats-interval).
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from exporters.gpu.nvml import Nvml
from exporters.gpu.server import GpuExporter, MetricsServer
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource, open_source
from loadlens.contracts.device_state import DeviceState, UtilSample
from tests.gpu.sim_example import example_state

GPUS = 8
PROCESSES = 64
WINDOW = 30.0
SCRAPE_P99_GOAL_S = 0.005
SAMPLER_CPU_GOAL = 0.01


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def build_state(sample_interval: float, now_us: int | None = None) -> DeviceState:
    n = int(WINDOW / sample_interval)
    now = time.time_ns() // 1000 if now_us is None else now_us
    return example_state(GPUS, PROCESSES, now_us=now, n_samples=n, sample_interval=sample_interval)


def make_exporter(source: Any, sample_interval: float = 0.1, refresh: float = 0.5) -> GpuExporter:
    sim = SimNvml(source, max_age=refresh)
    exporter = GpuExporter(Nvml(sim), backend="sim", sample_interval=sample_interval, window=WINDOW, proc_root=None)
    gc.collect()
    gc.freeze()  # as `loadlens gpu-exporter` does after start-up
    return exporter


def calibration_ns() -> float:
    """Nanoseconds per sorted() of a 3-item dict's items: a yardstick to compare machines."""
    d = {"gpu": "0", "uuid": "GPU-x", "model": "H100"}
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(20_000):
            sorted(d.items())
        best = min(best, (time.perf_counter_ns() - t0) / 20_000)
    return best


def bench_scrape_in_process(rate: float, n: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (thread) seconds per scrape; CPU is what the code costs, wall adds machine contention."""
    exporter = make_exporter(StaticSource(build_state(rate)))
    exporter.sampler.tick()
    wall, cpu = [], []
    for _ in range(n + 10):
        c0, t0 = time.thread_time(), time.perf_counter()
        exporter.scrape()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    exporter.stop()
    return wall[10:], cpu[10:]


def bench_scrape_http(rate: float, n: int) -> list[float]:
    exporter = make_exporter(StaticSource(build_state(rate)))
    exporter.sampler.tick()
    server = MetricsServer(exporter, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    times = []
    try:
        for _ in range(n + 10):
            t0 = time.perf_counter()
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            resp.read()
            times.append(time.perf_counter() - t0)
            assert resp.status == 200
    finally:
        conn.close()
        server.shutdown()
        server.server_close()
        exporter.stop()
    return times[10:]


def bench_sampler_cpu(source_factory: Callable[[], Any], seconds: float) -> dict[str, float]:
    exporter = make_exporter(source_factory(), sample_interval=0.1)
    exporter.session.ensure()
    exporter.sampler.tick()  # first fetch carries the whole window; steady state is what we measure
    cpu0, wall0, ticks0 = time.process_time(), time.monotonic(), exporter.sampler.ticks_total
    exporter.sampler.start()
    time.sleep(seconds)
    exporter.sampler.stop()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    ticks = exporter.sampler.ticks_total - ticks0
    exporter.stop()
    per_tick = 1e3 * cpu / max(ticks, 1)
    return {"cpu_share": cpu / wall, "ticks": ticks, "tick_hz": ticks / wall, "cpu_ms_per_tick": per_tick}


# --- a stand-in for the sim engine's /sim/device-state, run in its own process ---------------------------


def serve_documents(port_file: str, rate: float) -> None:
    """Serve the 8x64 document with samples generated up to now, newer than since_us."""
    base = build_state(rate)
    step_us = round(rate * 1e6)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            since = int(parse_qs(url.query).get("since_us", ["0"])[0])
            now = time.time_ns() // 1000
            start = max(since + 1, now - int(WINDOW * 1e6))
            first = start + (-start % step_us)
            samples = [
                UtilSample(timestamp_us=ts, gpu_percent=74.0 if (ts // (3 * step_us)) % 2 else 62.0)
                for ts in range(first, now + 1, step_us)
            ]
            with lock:
                devices = [d.model_copy(update={"util_samples": samples}) for d in base.devices]
                body = base.model_copy(update={"devices": devices, "timestamp_us": now}).model_dump_json().encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever(poll_interval=0.1)


class DocumentServer:
    def __init__(self, rate: float) -> None:
        self._dir = tempfile.TemporaryDirectory()
        port_file = os.path.join(self._dir.name, "port")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.gpu_exporter", "--serve-documents", port_file, "--rate", str(rate)]
        )
        deadline = time.monotonic() + 20
        while not os.path.exists(port_file) or not Path(port_file).read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("document server did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{Path(port_file).read_text()}/sim/device-state"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self._dir.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer scrapes, shorter CPU runs")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--serve-documents", help=argparse.SUPPRESS)
    p.add_argument("--rate", type=float, default=1 / 6, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve_documents:
        serve_documents(a.serve_documents, a.rate)
        return 0
    scrapes = 100 if a.quick else 400
    seconds = 3.0 if a.quick else 10.0
    results: dict[str, Any] = {"gpus": GPUS, "processes_per_gpu": PROCESSES, "window_s": WINDOW}
    cal = calibration_ns()
    results["calibration_sorted3_ns"] = cal
    print(f"GPU exporter benchmark: {GPUS} simulated GPUs x {PROCESSES} processes, window {WINDOW:.0f} s")
    print(f"machine yardstick: sorted() of a 3-item dict's items = {cal:.0f} ns")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"{'case':<52} {'median':>10} {'p99':>10}  goal")
    for label, rate in (("native 1/6 s", 1 / 6), ("sim 10 ms", 0.01)):
        n_samples = int(WINDOW / rate)
        wall, cpu = bench_scrape_in_process(rate, scrapes)
        http = bench_scrape_http(rate, scrapes)
        key = label.split()[0]
        for kind, t in (("in-process wall", wall), ("in-process CPU", cpu), ("HTTP wall", http)):
            med, p99 = statistics.median(t), pct(t, 0.99)
            passed = p99 <= SCRAPE_P99_GOAL_S
            name = f"scrape {kind}, samples {label} ({n_samples}/GPU)"
            print(f"{name:<52} {med * 1e3:>8.2f}ms {p99 * 1e3:>8.2f}ms  {'ok' if passed else 'MISSED'} (p99<=5ms)")
            results[f"scrape_{kind.replace(' ', '_').replace('-', '_').lower()}_{key}"] = {
                "median_s": med,
                "p99_s": p99,
                "n": len(t),
                "samples_per_gpu": n_samples,
            }
    for label, rate in (("native 1/6 s", 1 / 6), ("sim 10 ms", 0.01)):
        server = DocumentServer(rate)
        try:
            r = bench_sampler_cpu(lambda url=server.url: open_source(url), seconds)  # type: ignore[misc]
        finally:
            server.close()
        passed = r["cpu_share"] <= SAMPLER_CPU_GOAL
        name = f"sampler 10 Hz, HTTP document, samples {label}"
        print(
            f"{name:<52} {r['cpu_share'] * 100:>8.2f}% {r['cpu_ms_per_tick']:>7.3f}ms/tick  "
            f"{'ok' if passed else 'MISSED'} (<=1% core; {r['tick_hz']:.1f} Hz)"
        )
        results[f"sampler_http_{label.split()[0]}"] = r
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.json"
        path.write_text(build_state(1 / 6).model_dump_json())
        r = bench_sampler_cpu(lambda: open_source(str(path)), seconds)
    passed = r["cpu_share"] <= SAMPLER_CPU_GOAL
    name = "sampler 10 Hz, static file (no engine)"
    print(
        f"{name:<52} {r['cpu_share'] * 100:>8.2f}% {r['cpu_ms_per_tick']:>7.3f}ms/tick  "
        f"{'ok' if passed else 'MISSED'} (<=1% core; {r['tick_hz']:.1f} Hz)"
    )
    results["sampler_file"] = r
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
