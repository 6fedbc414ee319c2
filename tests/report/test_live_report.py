"""``loadlens report`` against a real Prometheus holding real data (the approach of tests/dashboards).

A sim server, the GPU exporter on its device state and a short ``loadlens load`` run (quick profile, time scale
0.1) are scraped every second; then the report is rendered from that Prometheus and the run's own results.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporters.cli import main
from exporters.common.child import http_child
from exporters.common.net import free_port
from exporters.dashboards.catalog import dashboards
from exporters.report.html import table_cells
from exporters.report.queries import PrometheusClient, collect
from exporters.report.results import load_results
from exporters.stack.config import PORTS
from tests.support.prometheus import PrometheusServer, require_prometheus

JOBS = {p.name: p.job for p in PORTS if p.job is not None}
CMD = [sys.executable, "-m", "exporters.cli"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_report_from_a_real_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_prometheus()
    serve_port, gpu_port, load_port = free_port(), free_port(), free_port()
    serve = [*CMD, "serve", "--engine", "sim", "--model-profile", "tiny", "--port", str(serve_port),
             "--log-level", "warning"]  # fmt: skip
    with http_child(serve, serve_port) as serve_url:
        gpu = [*CMD, "gpu-exporter", "--backend", "sim", "--sim-url", f"{serve_url}/sim/device-state",
               "--port", str(gpu_port), "--log-level", "warning"]  # fmt: skip
        with http_child(gpu, gpu_port):
            targets = {
                JOBS["serve"]: [f"127.0.0.1:{serve_port}"],
                JOBS["gpu"]: [f"127.0.0.1:{gpu_port}"],
                JOBS["loadgen"]: [f"127.0.0.1:{load_port}"],
            }
            with PrometheusServer(tmp_path / "prom", targets=targets) as prom:
                prom.wait_for_up(JOBS["serve"])
                prom.wait_for_up(JOBS["gpu"])
                load = [*CMD, "load", "--profile", "quick", "--time-scale", "0.1", "--headless", "--host", serve_url,
                        "--metrics-port", str(load_port), "--results", str(tmp_path / "results"),
                        "--run-id", "live", "--prometheus", prom.url]  # fmt: skip
                proc = subprocess.run(load, capture_output=True, text=True, timeout=45, cwd=tmp_path)
                assert proc.returncode in (0, 3), proc.stdout[-2000:] + proc.stderr[-2000:]
                time.sleep(2.5)  # two more scrapes
                results_file = tmp_path / "results" / "live" / "benchmark_result.json"
                out = tmp_path / "out"
                code = main(["report", "--prometheus", prom.url, "--results", str(results_file), "--out", str(out),
                             "--rate-interval", "15s"])  # fmt: skip
                captured = capsys.readouterr()
                assert code == 0, captured.err
                assert captured.out.strip() == f"loadlens report: {out / 'report.html'}"

                # The panels the guide's questions hang on have real data over the run's window.
                results = load_results(results_file)
                assert results.start is not None and results.end is not None
                panels, bands = collect(PrometheusClient(prom.url), dashboards(), results.start, results.end, "15s")
                with_data = {p.panel.title for p in panels if p.series}
                for title in ("TTFT (server)", "Output tokens per second", "GPU utilisation", "Users",
                              "VRAM used / reserved / total", "Running / waiting"):  # fmt: skip
                    assert title in with_data
                assert [b.name for b in bands] == [s.name for s in results.stages]

    page = (out / "report.html").read_text(encoding="utf-8")
    doc = json.loads(results_file.read_text())
    assert len(results.rows) == len(doc["stages"]) >= 2
    for row in results.rows:
        assert "<tr>" + "".join(f"<td>{c}</td>" for c in table_cells(row)) + "</tr>" in page
    first = doc["stages"][1]
    assert f"<td>{first['mean_ttft_ms']:.2f}</td><td>{first['p99_ttft_ms']:.2f}</td>" in page
    assert f"<td>{first['server']['peak_vram_gib']:.2f}</td>" in page
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(uris) == len(panels)
    assert all(base64.b64decode(u)[:8] == PNG_MAGIC for u in uris)
    assert "<script" not in page and 'src="http' not in page
