"""``loadlens report`` against a real Prometheus holding real data: the shared live run (tests/support/live.py:
sim server, GPU exporter, a short ``loadlens load``), rendered from that Prometheus and the run's own results.
"""

from __future__ import annotations

import base64
import json
import re
from html import unescape
from pathlib import Path

import pytest

from loadlens.cli import main
from loadlens.dashboards.catalog import LOAD_TEST_DASHBOARDS, dashboards
from loadlens.report.html import table_cells
from loadlens.report.queries import collect
from loadlens.report.results import load_results
from loadlens.report.sections import flat_zero
from loadlens.util.prometheus import PrometheusClient
from tests.support.live import LiveRun

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_report_from_a_real_run(live_run: LiveRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prom, results_file = live_run.prom, live_run.results_file
    out = tmp_path / "out"
    code = main(["report", "--prometheus", prom.url, "--results", str(results_file), "--out", str(out),
                 "--rate-interval", "15s"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.strip() == f"loadlens report: {out / 'index.html'}"

    # The panels the guide's questions hang on have real data over the run's window.
    results = load_results(results_file)
    assert results.start is not None and results.end is not None
    boards = {stem: b for stem, b in dashboards().items() if stem in LOAD_TEST_DASHBOARDS}  # what the report draws
    panels, bands = collect(PrometheusClient(prom.url), boards, results.start, results.end, "15s")
    with_data = {p.panel.title for p in panels if p.series}
    for title in ("TTFT (server)", "Output tokens per second", "GPU utilisation", "Users",
                  "VRAM used / reserved / total", "Running / waiting"):  # fmt: skip
        assert title in with_data
    assert [b.name for b in bands] == [s.name for s in results.stages]

    page = (out / "index.html").read_text(encoding="utf-8")
    assert re.findall(r'<h2 id="([^"]+)">', page) == [
        "verdict", "alerts", "stages", "load", "slo", "latency", "engine", "gpu", "vram", "rig",
    ]  # fmt: skip
    doc = json.loads(results_file.read_text())
    assert len(results.rows) == len(doc["stages"]) >= 2
    for row in results.rows:
        assert "<tr>" + "".join(f"<td>{c}</td>" for c in table_cells(row)) + "</tr>" in page
    first = doc["stages"][1]
    assert f"<td>{first['mean_ttft_ms']:.2f}</td><td>{first['p99_ttft_ms']:.2f}</td>" in page
    assert f"<td>{first['server']['peak_vram_gib']:.2f}</td>" in page
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert all(base64.b64decode(u)[:8] == PNG_MAGIC for u in uris)
    # Every panel is drawn, or named once in a "nothing happened" (flat at 0) or "no data" line.
    drawn = [unescape(t) for t in re.findall(r'<img alt="([^"]+)"', page)]
    assert len(drawn) == len(uris)
    lines = re.findall(r'<p class="(?:nothing|nodata)"[^>]*><strong>[^<]+</strong> \([^)]+\): ([^<]+)\.</p>', page)
    named = [unescape(t) for line in lines for t in line.split(", ")]
    assert sorted(drawn + named) == sorted(p.panel.title for p in panels)
    flat = {p.panel.title for p in panels if flat_zero(p)}
    assert {"Preemptions", "XID errors"} <= flat  # nothing preempted, no XID in a quick sim run
    assert not flat & set(drawn)
    for title in with_data - flat:
        assert title in drawn
    assert "<script" not in page and 'src="http' not in page
