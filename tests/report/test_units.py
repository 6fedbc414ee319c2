"""Pure pieces of ``loadlens report`` with fixed inputs: times, substitution, legends, stages, table, HTML, PNG."""

from __future__ import annotations

import base64
import json
import re
import struct
from pathlib import Path

import pytest

from loadlens.contracts.results import ResultsError
from loadlens.contracts.slo import load_slos
from loadlens.dashboards.catalog import dashboards
from loadlens.report.charts import drop_all_zero, render, unit_for
from loadlens.report.html import Chart, ChartSection, render_page, table_cells
from loadlens.report.queries import (
    RefLine,
    Series,
    Stage,
    concrete,
    legend,
    parse_duration,
    parse_time,
    reference_lines,
    stages_from_series,
    step_for,
    to_series,
)
from loadlens.report.results import load_results, parse_results

FIXTURE = Path(__file__).with_name("fixtures") / "benchmark_result.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1795995431", 1795995431.0),
        ("1795995431.045", 1795995431.045),
        ("2026-11-29T23:37:11Z", 1795995431.0),
        ("2026-11-29T23:37:11.045Z", 1795995431.045),
        ("2026-11-29T23:37:11", 1795995431.0),
        ("2026-11-30T00:37:11+01:00", 1795995431.0),
    ],
)
def test_parse_time(text: str, expected: float) -> None:
    assert parse_time(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["yesterday", "", "-5", "nan", "2026-13-01T00:00:00Z"])
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a time"):
        parse_time(text)


def test_parse_duration() -> None:
    assert parse_duration("30s") == "30s"
    with pytest.raises(ValueError):
        parse_duration("30")


def test_every_dashboard_query_becomes_concrete() -> None:
    for board in dashboards().values():
        for panel in board.panels():
            for target in panel.targets:
                expr = concrete(target.expr, "30s")
                assert "$" not in expr, expr
    assert concrete('rate(x{a=~"$model"}[$__rate_interval])', "1m") == 'rate(x{a=~".*"}[1m])'


def test_legend_and_step() -> None:
    assert legend("gpu {{gpu}} {{ owner }}", {"gpu": "0", "owner": "kv_cache"}) == "gpu 0 kv_cache"
    assert legend("{{missing}}", {}) == "value"
    assert step_for(0, 100) == 1
    assert step_for(0, 4000) == 10


def test_to_series_drops_nan_and_empty() -> None:
    result = [
        {"metric": {"code": "200"}, "values": [[1.0, "2"], [2.0, "NaN"], [3.0, "4"]]},
        {"metric": {"code": "500"}, "values": [[1.0, "NaN"]]},
    ]
    assert to_series(result, "server {{code}}") == [Series("server 200", (1.0, 3.0), (2.0, 4.0))]


def test_stages_from_series() -> None:
    series = [
        Series("c8", (0.0, 1.0, 2.0, 3.0), (1.0, 1.0, 0.0, 0.0)),
        Series("c16", (0.0, 1.0, 2.0, 3.0), (0.0, 0.0, 1.0, 1.0)),
    ]
    assert stages_from_series(series) == [Stage("c8", 0.0, 2.0), Stage("c16", 2.0, 3.0)]


def test_reference_lines_come_from_the_slo_file() -> None:
    slos = load_slos()
    panels = {p.title: p for b in dashboards().values() for p in b.panels()}
    ttft = reference_lines(panels["TTFT (server)"], slos)
    assert ttft == [RefLine(c.ttft_seconds, f"SLO TTFT {c.name}") for c in slos.classes]
    swing = reference_lines(panels["Utilisation swing (p95 − p5)"], slos)
    assert swing == [RefLine(slos.gpu["util_peak_to_trough_ratio"], "threshold")]
    assert reference_lines(panels["Users"], slos) == []


def test_results_fixture() -> None:
    results = load_results(FIXTURE)
    assert results.start == 1795995431.045 and results.end == 1795995503.328
    assert [s.name for s in results.stages] == ["warmup", "c8", "c16", "c32"]
    assert results.stages[0].warmup
    assert table_cells(results.rows[1]) == ["c8", "224.60", "327.30", "486.4", "36.79", "96.2 %", "43.1 %"]
    assert table_cells(results.rows[3]) == ["c32", "306.26", "–", "1126.4", "–", "–", "–"]


def test_results_errors(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{")
    with pytest.raises(ResultsError, match="not valid JSON"):
        load_results(bad)
    with pytest.raises(ResultsError, match="not a loadlens"):
        parse_results({"schema": "other"})
    with pytest.raises(ResultsError, match="cannot read"):
        load_results(tmp_path / "missing.json")


def test_chart_is_a_png() -> None:
    series = [Series("p99", tuple(float(t) for t in range(0, 60, 2)), tuple(0.1 + t / 600 for t in range(0, 60, 2)))]
    png = render(
        "TTFT (server)",
        "s",
        series,
        start=0.0,
        end=60.0,
        stages=[Stage("c8", 0.0, 30.0), Stage("c16", 30.0, 60.0)],
        ref_lines=[RefLine(0.2, "SLO TTFT interactive")],
    )
    assert png_size(png) == (960, 440)
    empty = render("Nothing", "bytes", [], start=0.0, end=10.0, stacked=True)
    assert empty[:8] == PNG_MAGIC
    assert unit_for("s").factor == 1000.0 and unit_for("bytes").label == "GiB"


def test_page_has_table_and_embedded_pngs() -> None:
    results = load_results(FIXTURE)
    doc = json.loads(FIXTURE.read_text())
    png = render("Users", "short", [], start=0.0, end=10.0)
    chart = Chart("chart-users", "loadlens / Load test overview", "Load", "Users", "Locust users <running>", png)
    page = render_page(
        prometheus="http://127.0.0.1:1",
        start=results.start or 0.0,
        end=results.end or 0.0,
        sections=[ChartSection("load", "What load did the test apply?", "Users.", (chart,))],
        results=results,
        rate_interval="30s",
        generated=0.0,
    )
    # Exact figures of the fixture, formatted as documented (ms 2 dp, tok/s 1 dp, GiB 2 dp, % 1 dp).
    for stage in doc["stages"]:
        row = (
            f"<td>{stage['mean_ttft_ms']:.2f}</td>"
            + (f"<td>{stage['p99_ttft_ms']:.2f}</td>" if stage["p99_ttft_ms"] is not None else "<td>–</td>")
            + f"<td>{stage['output_throughput']:.1f}</td>"
        )
        assert row in page
    assert "<td>c16</td><td>229.70</td><td>429.70</td><td>819.2</td><td>38.50</td><td>94.5 %</td><td>9.2 %</td>" in page
    assert "<td>warmup</td><td>161.88</td>" in page
    assert "Locust users &lt;running&gt;" in page
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(uris) == 1 and base64.b64decode(uris[0]) == png
    assert "http" not in page.replace("http://127.0.0.1:1", ""), "no external resources"


def test_all_zero_series_leave_the_legend() -> None:
    ok = Series("client success", (1.0, 2.0), (3.0, 4.0))
    zero = Series("client timeout", (1.0, 2.0), (0.0, 0.0))
    assert drop_all_zero([ok, zero]) == ([ok], 1)
    assert drop_all_zero([zero]) == ([zero], 0)
    assert drop_all_zero([zero], boolean=True) == ([], 1)
