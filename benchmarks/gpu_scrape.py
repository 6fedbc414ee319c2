"""GPU exporter scrape latency, before and after issue 24, in one run: NVML read at scrape time or on the
sampler's schedule.

    python -m benchmarks.gpu_scrape            # ~60 s on 2 busy vCPUs
    python -m benchmarks.gpu_scrape --quick    # ~25 s
    python -m benchmarks.gpu_scrape --json out.json

Both paths are the same code: ``GpuExporter(collect_on_scrape=True)`` runs the collectors' pass inside each
scrape (every NVML read, the families, the encoding: what a scrape cost before issue 24), the default runs
it on the sampler's thread every ``--collect-interval`` (1 s) and the scrape serves the latest pass. Sim
backend, default collectors, a static document (samples at NVML's native 1/6 s over the 30 s window).

Cases, each for 1 GPU x 1 process and 8 GPUs x 64 processes, before and after:
- scrape in process: ``GpuExporter.scrape()`` (what /metrics serves Prometheus), wall time, and the scraping
  thread's CPU time (what the code costs, whatever the neighbours do);
- scrape over HTTP: GET /metrics on the exporter's own server, one kept-alive connection, wall time;
- sampler CPU per second of wall time: the sampler thread's own CPU (``loadlens_gpu_sampler_cpu_seconds_total``,
  thread time) with its default schedule (polls every 0.1 s, passes every 1 s), no scrapes.

The sampler thread runs during the scrape cases too (as in the exporter), so an after-scrape may wait for
the GIL behind a pass. Scrapes are paced every 10 ms (back to back when one takes longer), so they spread
over several passes. The two modes alternate in rounds, so machine load hits both alike.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from exporters.gpu.nvml import Nvml
from exporters.gpu.server import GpuExporter, MetricsServer
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource
from tests.gpu.sim_example import example_state

WINDOW = 30.0
RATE = 1 / 6
SHAPES = ((1, 1), (8, 64))  # (GPUs, processes per GPU)
MODES = ("before", "after")
PACE_S = 0.01
GOAL_8X64_P99_S = 0.005  # issue 24 on the sim backend; the real-GPU goal (2 ms) is make gpu-check's


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def make_exporter(gpus: int, processes: int, mode: str) -> GpuExporter:
    state = example_state(
        gpus, processes, now_us=time.time_ns() // 1000, n_samples=int(WINDOW / RATE), sample_interval=RATE
    )
    exporter = GpuExporter(
        Nvml(SimNvml(StaticSource(state), max_age=0.5)),
        backend="sim",
        window=WINDOW,
        proc_root=None,
        collect_on_scrape=mode == "before",
    )
    exporter.sample_now()  # the first fetch and pass; steady state is what is measured
    gc.collect()
    gc.freeze()  # as `loadlens gpu-exporter` does after start-up
    return exporter


def _paced(n: int, once: Any) -> list[float]:
    times: list[float] = []
    next_at = time.perf_counter()
    for _ in range(n + 5):
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
        next_at = max(next_at + PACE_S, time.perf_counter())
    return times[5:]  # warm-up


def scrape_in_process(exporter: GpuExporter, n: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (this thread's) seconds per scrape: CPU is what the code costs, wall adds the waits
    (the GIL behind a pass, a machine busy with other work)."""
    cpu: list[float] = []

    def once() -> None:
        c0 = time.thread_time()
        exporter.scrape()
        cpu.append(time.thread_time() - c0)

    wall = _paced(n, once)
    return wall, cpu[5:]


def scrape_http(exporter: GpuExporter, n: int) -> list[float]:
    server = MetricsServer(exporter, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)

    def once() -> None:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/metrics answered {resp.status}")

    try:
        return _paced(n, once)
    finally:
        conn.close()
        server.shutdown()
        server.server_close()
        thread.join(5)


def sampler_cpu(exporter: GpuExporter, seconds: float) -> float:
    """The sampler thread's CPU seconds per wall second, on its default schedule, with nobody scraping."""
    cpu0, wall0 = exporter.sampler.cpu_seconds_total, time.monotonic()
    time.sleep(seconds)
    return (exporter.sampler.cpu_seconds_total - cpu0) / (time.monotonic() - wall0)


def measure(gpus: int, processes: int, mode: str, n: int, seconds: float) -> dict[str, Any]:
    exporter = make_exporter(gpus, processes, mode)
    exporter.start()
    try:
        in_process, in_process_cpu = scrape_in_process(exporter, n)
        over_http = scrape_http(exporter, n)
        cpu = sampler_cpu(exporter, seconds)
        series = exporter.scrape().count(b"\n") - exporter.scrape().count(b"# ")
    finally:
        exporter.stop()
        gc.unfreeze()
    return {
        "in_process_s": in_process,
        "in_process_cpu_s": in_process_cpu,
        "http_s": over_http,
        "sampler_cpu_share": cpu,
        "series": series,
    }


def summary(times: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(times) * 1e3, "p99_ms": pct(times, 0.99) * 1e3, "n": len(times)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer scrapes, shorter sampler runs")
    p.add_argument("--rounds", type=int, default=None, help="alternating before/after rounds (default 2, quick 1)")
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args(argv)
    n = 100 if a.quick else 200
    seconds = 3.0 if a.quick else 5.0
    rounds = a.rounds or (1 if a.quick else 2)
    load = Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else "n/a"
    print("GPU exporter scrape, before (reads at scrape time) vs after (reads on the sampler's schedule)")
    print(f"/proc/loadavg before: {load}; {os.cpu_count()} CPUs; {rounds} round(s) x {n} scrapes per case")
    raw: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for gpus, procs in SHAPES:
            for mode in MODES:
                raw.setdefault((gpus, procs, mode), []).append(measure(gpus, procs, mode, n, seconds))
    results: dict[str, Any] = {"loadavg_before": load, "cpus": os.cpu_count(), "rounds": rounds, "cases": {}}
    header = f"{'case':<34} {'before p50':>11} {'before p99':>11} {'after p50':>10} {'after p99':>10}"
    print(header)
    for gpus, procs in SHAPES:
        shape = f"{gpus} GPU x {procs} proc"
        row: dict[str, Any] = {}
        for mode in MODES:
            runs = raw[(gpus, procs, mode)]
            row[mode] = {
                "in_process": summary([t for r in runs for t in r["in_process_s"]]),
                "in_process_cpu": summary([t for r in runs for t in r["in_process_cpu_s"]]),
                "http": summary([t for r in runs for t in r["http_s"]]),
                "sampler_cpu_share": statistics.median(r["sampler_cpu_share"] for r in runs),
                "series": runs[0]["series"],
            }
        results["cases"][shape] = row
        b, f = row["before"], row["after"]
        for kind in ("in_process", "in_process_cpu", "http"):
            name = f"{shape}, {kind.replace('_', '-').replace('-cpu', ' CPU')}"
            print(
                f"{name:<34} {b[kind]['p50_ms']:>9.2f}ms {b[kind]['p99_ms']:>9.2f}ms "
                f"{f[kind]['p50_ms']:>8.2f}ms {f[kind]['p99_ms']:>8.2f}ms"
            )
        print(
            f"{shape + ', sampler CPU':<34} {b['sampler_cpu_share'] * 100:>10.2f}% {'':>11} "
            f"{f['sampler_cpu_share'] * 100:>9.2f}%   ({f['series']} series)"
        )
    after = results["cases"]["8 GPU x 64 proc"]["after"]
    worst = max(after["in_process"]["p99_ms"], after["http"]["p99_ms"])
    verdict = "ok" if worst <= GOAL_8X64_P99_S * 1e3 else "MISSED"
    print(f"goal: 8 GPUs x 64 processes, after, p99 <= 5 ms in process and over HTTP: {verdict} ({worst:.2f} ms)")
    load = Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else "n/a"
    print(f"/proc/loadavg after: {load}")
    results["loadavg_after"] = load
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
