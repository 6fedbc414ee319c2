"""One short, real run of the whole measurement path, shared by the tests that need live data.

A sim server, the GPU exporter on its device state and ``loadlens load --profile quick --time-scale 0.2``
(about 17 s: measured stages of 4 s, so that each holds several of the 1 s scrapes even when one or two fail
or come late on a busy machine: a stage's counters are its last scrape less its first), scraped every second
by a real Prometheus under the job names of ``loadlens/contracts/ports.py``.
The dashboards' proof and the report test both read it (``live_run`` fixture in tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loadlens.contracts.ports import PORTS
from loadlens.util.child import http_child
from loadlens.util.net import free_port
from tests.support.prometheus import PrometheusServer, require_prometheus

JOBS = {p.name: p.job for p in PORTS if p.job is not None}
CMD = [sys.executable, "-m", "loadlens.cli"]
MODEL = "tiny"


@dataclass(frozen=True)
class LiveRun:
    prom: PrometheusServer
    start: float
    end: float
    results_file: Path


@contextlib.contextmanager
def live_sim_run(tmp: Path) -> Iterator[LiveRun]:
    require_prometheus()
    serve_port, gpu_port, load_port = free_port(), free_port(), free_port()
    serve = [*CMD, "serve", "--engine", "sim", "--model-profile", MODEL, "--port", str(serve_port),
             "--enable-mfu-metrics", "--log-level", "warning"]  # fmt: skip
    with http_child(serve, serve_port) as serve_url:
        gpu = [*CMD, "gpu-exporter", "--backend", "sim", "--sim-url", f"{serve_url}/sim/device-state",
               "--port", str(gpu_port), "--log-level", "warning"]  # fmt: skip
        with http_child(gpu, gpu_port):
            targets = {
                JOBS["serve"]: [f"127.0.0.1:{serve_port}"],
                JOBS["gpu"]: [f"127.0.0.1:{gpu_port}"],
                JOBS["loadgen"]: [f"127.0.0.1:{load_port}"],
            }
            with PrometheusServer(tmp / "prom", targets=targets) as prom:
                prom.wait_for_up(JOBS["serve"])
                prom.wait_for_up(JOBS["gpu"])
                start = time.time()
                load = [*CMD, "load", "--profile", "quick", "--time-scale", "0.2", "--headless", "--host", serve_url,
                        "--metrics-port", str(load_port), "--results", str(tmp / "results"), "--run-id", "live",
                        "--prometheus", prom.url]  # fmt: skip
                proc = subprocess.run(load, capture_output=True, text=True, timeout=45, cwd=tmp)
                # 3: completed, but the CPU guard flagged the results (a busy CI box); the series exist.
                assert proc.returncode in (0, 3), proc.stdout[-2000:] + proc.stderr[-2000:]
                time.sleep(2.5)  # two more scrapes of the server and the GPU exporter
                yield LiveRun(prom, start, time.time(), tmp / "results" / "live" / "benchmark_result.json")
