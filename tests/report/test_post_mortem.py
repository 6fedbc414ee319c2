"""The report as a post-mortem, from fixed inputs: section order, table of contents, question grouping,
flat-zero collapse, alert intervals and their shading, the verdict, and where the page goes."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from loadlens.cli import main
from loadlens.contracts.results import ResultsError, Verdict
from loadlens.contracts.slo import load_slos
from loadlens.dashboards.catalog import LOAD_TEST_DASHBOARDS, dashboards
from loadlens.report.charts import ALERT_ALPHA, ALERT_COLOURS, alert_legend, figure
from loadlens.report.cli import build_report, chart_sections, out_dir
from loadlens.report.html import render_page, slo_cells
from loadlens.report.queries import (
    ALERTS_QUERY,
    FiredAlert,
    PanelData,
    RefLine,
    Series,
    Stage,
    alert_intervals,
    reference_lines,
)
from loadlens.report.results import PageRow, SLORow, load_results, parse_results, verdict_view
from loadlens.report.sections import OTHER, QUESTIONS, flat_zero, no_data, order_panels, question_of, slug
from loadlens.util.cliutil import UsageError

FIXTURE = Path(__file__).with_name("fixtures") / "benchmark_result.json"
T0 = 1795995431.0
SECTIONS_WITH_RESULTS = [
    ("verdict", "Verdict"),
    ("alerts", "Alerts that fired"),
    ("stages", "Per stage"),
    ("load", "What load did the test apply?"),
    ("slo", "Did we meet the SLO?"),
    ("latency", "Where did latency come from?"),
    ("engine", "Did the engine queue, preempt or reject?"),
    ("gpu", "Was the GPU the bottleneck?"),
    ("vram", "Did VRAM and the allocator hold up?"),
    ("rig", "Could the test rig keep up?"),
]
VERDICT: dict[str, Any] = {
    "status": "fail",
    "headline": "FAIL: TTFT p99 (interactive) at c16 above 200 ms; 1 page",
    "slos": [
        {"slo": "ttft", "priority_class": "interactive", "stage": "c8", "statistic": "p99", "comparison": "<=",
         "threshold": 200.0, "observed": 187.5, "unit": "ms", "passed": True},
        {"slo": "ttft", "priority_class": "interactive", "stage": "c16", "statistic": "p99", "comparison": "<=",
         "threshold": 200.0, "observed": 412.25, "unit": "ms", "passed": False},
        {"slo": "goodput", "priority_class": "batch", "stage": "overall", "statistic": "ratio", "comparison": ">=",
         "threshold": 0.95, "observed": None, "unit": "ratio", "passed": None},
    ],
    "alerts": [
        {"alertname": "LoadlensTTFTBudgetBurn", "severity": "critical", "state": "resolved",
         "starts_at": "2026-11-29T23:37:50Z", "ends_at": "2026-11-29T23:38:10Z", "labels": {"slo": "ttft"}},
    ],
    "pages": [
        {"alertname": "LoadlensTTFTBudgetBurn", "severity": "critical", "receiver": "pager", "status": "firing",
         "at": "2026-11-29T23:37:56Z"},
    ],
    "window": {"start": "2026-11-29T23:37:11Z", "end": "2026-11-29T23:38:23Z", "checked_until": "2026-11-29T23:38:53Z"},
    "alerts_source": "http://127.0.0.1:19090",
    "pages_source": "http://127.0.0.1:9095",
    "errors": [],
}  # fmt: skip


def _load_test_panels() -> list[PanelData]:
    boards = {stem: b for stem, b in dashboards().items() if stem in LOAD_TEST_DASHBOARDS}
    out = []
    for board in boards.values():
        for row in board.rows:
            for panel in row.panels:
                if panel.kind != "stat" and panel.title != "Stage":
                    out.append(PanelData(board.title, row.title, panel))
    return out


def _with(panels: list[PanelData], series: dict[str, list[Series]]) -> list[PanelData]:
    for data in panels:
        data.series = list(series.get(data.panel.title, []))
    return panels


RISING = [Series("p99", (T0, T0 + 10, T0 + 20), (0.1, 0.3, 0.2))]
ZEROS = [Series("preemptions/s", (T0, T0 + 10, T0 + 20), (0.0, 0.0, 0.0))]


def _page(with_results: bool = True, verdict: dict[str, Any] | None = None) -> str:
    results = None
    if with_results:
        doc = json.loads(FIXTURE.read_text())
        results = parse_results(doc, str(FIXTURE))
        if verdict is not None:
            results = replace(results, verdict=verdict_view(Verdict.model_validate(verdict)))
    panels = _with(_load_test_panels(), {"TTFT (server)": RISING, "Users": RISING, "Preemptions": ZEROS})
    alerts = [FiredAlert("LoadlensTTFTBudgetBurn", "critical", (("slo", "ttft"),), T0 + 5, T0 + 15)]
    sections = chart_sections(panels, load_slos(), T0, T0 + 20, [Stage("c8", T0, T0 + 20)], alerts)
    return render_page(
        prometheus="http://127.0.0.1:1",
        start=T0,
        end=T0 + 20,
        sections=sections,
        results=results,
        rate_interval="30s",
        generated=T0,
        alerts=alerts,
    )


def _h2(page: str) -> list[tuple[str, str]]:
    return re.findall(r'<h2 id="([^"]+)">([^<]+)</h2>', page)


def test_sections_and_their_order() -> None:
    assert _h2(_page()) == SECTIONS_WITH_RESULTS
    assert _h2(_page(with_results=False)) == [s for s in SECTIONS_WITH_RESULTS if s[0] != "stages"]


def test_table_of_contents_anchors_resolve() -> None:
    page = _page()
    ids = re.findall(r'id="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "ids are unique"
    toc = page[page.index('<nav class="toc"') : page.index("</nav>")]
    hrefs = re.findall(r'href="#([^"]+)"', toc)
    assert set(hrefs) <= set(ids)
    # Every section, then the drawn charts under theirs.
    assert hrefs == [
        "verdict", "alerts", "stages", "load", "chart-users", "slo", "chart-ttft-server", "latency", "engine",
        "gpu", "vram", "rig",
    ]  # fmt: skip
    assert re.findall(r'href="#([^"]+)"', page) == hrefs, "no link outside the contents"


def test_every_load_test_panel_answers_a_question() -> None:
    panels = _load_test_panels()
    assert [p.panel.title for p in panels if question_of(p.panel.title) is OTHER] == []
    titles = [p.panel.title for p in panels]
    claimed = [t for q in QUESTIONS for t in q.panels]
    assert sorted(claimed) == sorted(titles), "no question names a panel the dashboards lack"
    assert len(titles) == len(set(titles))
    grouped = order_panels(panels)
    assert [q.anchor for q, _ in grouped] == [q.anchor for q in QUESTIONS]
    for question, members in grouped:
        assert [m.panel.title for m in members] == list(question.panels)


def test_flat_zero_and_no_data_are_named_not_drawn() -> None:
    page = _page()
    engine = page[page.index('<h2 id="engine">') : page.index('<h2 id="gpu">')]
    assert (
        '<p class="nothing" id="engine-nothing"><strong>Nothing happened</strong> (0 throughout the window, not '
        "drawn): Preemptions.</p>"
    ) in engine
    assert (
        '<p class="nodata" id="engine-nodata"><strong>No data</strong> (no series in this window, not drawn): '
        "Running / waiting, KV cache usage, Rejected requests, Aborted requests, Errors by reason.</p>"
    ) in engine
    assert re.findall(r'<img alt="([^"]+)"', page) == ["Users", "TTFT (server)"]
    data = PanelData("d", "r", _load_test_panels()[0].panel, list(ZEROS))
    assert flat_zero(data) and not no_data(data)
    data.errors.append("refused")
    assert not flat_zero(data), "a chart with a refused query is drawn, with the error under it"
    assert no_data(PanelData("d", "r", data.panel)) and not flat_zero(PanelData("d", "r", data.panel))
    mixed = PanelData("d", "r", data.panel, [*ZEROS, Series("x", (T0,), (0.5,))])
    assert not flat_zero(mixed)


def test_alert_intervals_from_an_alerts_matrix() -> None:
    step = 2
    result: list[dict[str, Any]] = [
        {  # fires t+4..t+8, resolves, fires again t+14 to the end
            "metric": {"__name__": "ALERTS", "alertname": "LoadlensTTFTBudgetBurn", "alertstate": "firing",
                       "severity": "critical", "slo": "ttft", "priority_class": "interactive"},
            "values": [[T0 + t, "1"] for t in (4, 6, 8, 14, 16, 18, 20)],
        },
        {  # already firing at the window's start, resolved after t+2
            "metric": {"__name__": "ALERTS", "alertname": "LoadlensKVCacheFull", "alertstate": "firing",
                       "severity": "warning"},
            "values": [[T0, "1"], [T0 + 2, "1"]],
        },
        {"metric": {"alertname": "Empty"}, "values": []},
    ]  # fmt: skip
    labels = (("priority_class", "interactive"), ("slo", "ttft"))
    assert alert_intervals(result, T0, T0 + 20, step) == [
        FiredAlert("LoadlensKVCacheFull", "warning", (), T0, T0 + 4, open_start=True),
        FiredAlert("LoadlensTTFTBudgetBurn", "critical", labels, T0 + 4, T0 + 10),
        FiredAlert("LoadlensTTFTBudgetBurn", "critical", labels, T0 + 14, T0 + 20, open_end=True),
    ]


def test_alerts_table_and_chart_shading() -> None:
    page = _page()
    alerts = page[page.index('<h2 id="alerts">') : page.index('<h2 id="stages">')]
    assert (
        "<tr><td>LoadlensTTFTBudgetBurn</td><td>critical</td><td>slo=ttft</td><td>23:37:16 (t+5 s)</td>"
        "<td>23:37:26 (t+15 s)</td><td>10 s</td></tr>"
    ) in alerts
    alert = FiredAlert("LoadlensTTFTBudgetBurn", "critical", (), T0 + 5, T0 + 15)
    fig = figure("Users", "short", RISING, start=T0, end=T0 + 20, stages=[Stage("c8", T0, T0 + 20)], alerts=[alert])
    (ax,) = fig.axes
    shaded = [p for p in ax.patches if p.get_alpha() == ALERT_ALPHA]
    assert [(p.get_x(), p.get_width()) for p in shaded] == [(5.0, 10.0)]  # type: ignore[attr-defined]
    legend = ax.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == ["p99", "alert LoadlensTTFTBudgetBurn (critical)"]
    assert alert_legend([alert], T0 + 16, T0 + 20) == [], "an alert outside the window is not in the legend"
    assert alert_legend([alert], T0, T0 + 20) == [
        ("alert LoadlensTTFTBudgetBurn (critical)", ALERT_COLOURS["critical"])
    ]
    # No alert: the same chart without the alert entry.
    plain = figure("Users", "short", RISING, start=T0, end=T0 + 20)
    assert [p for p in plain.axes[0].patches if p.get_alpha() == ALERT_ALPHA] == []


def test_slo_line_on_every_latency_chart() -> None:
    slos = load_slos()
    panels = {p.panel.title: p for p in _load_test_panels()}
    per_class = {name: [RefLine(c.thresholds()[name], f"SLO {name.upper()} {c.name}") for c in slos.classes]
                 for name in ("ttft", "itl", "e2e")}  # fmt: skip
    expected = {
        "TTFT (server)": "ttft", "ITL (server)": "itl", "E2E latency (server)": "e2e", "TTFT: client vs server": "ttft",
        "TTFT p99 by priority class": "ttft", "Queue time": "ttft", "Prefill time": "ttft", "Decode time": "e2e",
    }  # fmt: skip
    for title, name in expected.items():
        question = question_of(title)
        extra = dict(question.slo_lines).get(title)
        assert reference_lines(panels[title].panel, slos, extra) == per_class[name], title
    assert reference_lines(panels["Swap blocking"].panel, slos) == [
        RefLine(slos.lora_swap.delay_seconds, "SLO swap delay")
    ]


def test_verdict_from_a_hand_built_result() -> None:
    page = _page(verdict=VERDICT)
    verdict = page[page.index('<h2 id="verdict">') : page.index('<h2 id="alerts">')]
    assert (
        '<p class="verdict verdict-fail"><strong>FAIL</strong> TTFT p99 (interactive) at c16 above 200 ms; 1 page</p>'
    ) in verdict
    rows = re.findall(r"<tr>(.*?)</tr>", verdict)
    cells = [re.findall(r"<t[dh]>(.*?)</t[dh]>", r) for r in rows]
    assert cells == [
        ["SLO", "Class", "Stage", "Objective", "Observed", "Result"],
        ["TTFT", "interactive", "c16", "p99 ≤ 200.00 ms", "412.25 ms", "FAIL"],
        ["TTFT", "interactive", "c8", "p99 ≤ 200.00 ms", "187.50 ms", "pass"],
        ["goodput", "batch", "overall", "ratio ≥ 95.00 %", "–", "–"],
        ["Alert", "Severity", "Receiver", "Status", "Received"],
        ["LoadlensTTFTBudgetBurn", "critical", "pager", "firing", "2026-11-29 23:37:56 UTC"],
    ]
    assert "<title>loadlens report: fixture-run (FAIL)</title>" in page
    assert "Alerts the load generator saw up to 2026-11-29 23:38:53 UTC: LoadlensTTFTBudgetBurn (resolved)." in page
    assert slo_cells(SLORow("error_ratio", None, "c8", "ratio", ">=", None, None, "ratio", None)) == [
        "error_ratio", "all", "c8", "ratio ≥ –", "–", "–",
    ]  # fmt: skip


def test_without_a_verdict() -> None:
    page = _page()
    assert (
        '<p class="verdict verdict-none">No verdict in the results file (written before the load generator judged '
        "runs); the alerts below come from Prometheus.</p>"
    ) in page
    assert '<p class="verdict verdict-none">No verdict: the report was made without --results.</p>' in _page(False)
    assert verdict_view(None) is None
    partial = verdict_view(Verdict.model_validate({"status": "unknown", "headline": "UNKNOWN: no samples"}))
    assert partial is not None
    assert (partial.slos, partial.pages, partial.checked_until_timestamp) == ((), (), None)
    no_pages = {**VERDICT, "pages": []}
    page = _page(verdict=no_pages)
    assert '<p class="desc">No page reached the pager (http://127.0.0.1:9095).</p>' in page
    page = _page(verdict={**no_pages, "pages_source": None})
    assert '<p class="desc">Pages were not checked (the load generator had no pager to ask).</p>' in page


def test_verdict_read_from_a_results_file(tmp_path: Path) -> None:
    doc = json.loads(FIXTURE.read_text())
    doc["verdict"] = copy.deepcopy(VERDICT)
    file = tmp_path / "benchmark_result.json"
    file.write_text(json.dumps(doc))
    results = load_results(tmp_path)  # the run directory
    assert results.source == str(file)
    assert results.verdict is not None
    assert (results.verdict.status, results.verdict.checked_until_timestamp) == ("fail", 1795995533.0)
    assert results.verdict.slos[1] == SLORow("ttft", "interactive", "c16", "p99", "<=", 200.0, 412.25, "ms", False)
    assert results.verdict.pages == (
        PageRow("LoadlensTTFTBudgetBurn", "critical", "pager", "firing", "2026-11-29T23:37:56Z"),
    )
    doc["verdict"]["status"] = "maybe"
    file.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"verdict\.status"):
        load_results(file)


def test_slug() -> None:
    assert slug("TTFT (server)") == "ttft-server"
    assert slug("Utilisation swing (p95 − p5)") == "utilisation-swing-p95-p5"
    assert slug("!!!") == "x"


def test_output_path_rules(tmp_path: Path) -> None:
    results = load_results(FIXTURE)
    assert out_dir(None, results) == FIXTURE.parent / "report"
    assert out_dir(tmp_path / "elsewhere", results) == tmp_path / "elsewhere"
    with pytest.raises(UsageError, match=r"^--out is required without --results"):
        out_dir(None, None)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match=r"exists and is not a directory$"):
        out_dir(tmp_path / "file", results)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--from", "1", "--to", "2"], "--out is required without --results"),
        (["--results", "{empty}"], "is a directory without a benchmark_result.json"),
        (["--results", "{fixture}", "--out", "{file}"], "exists and is not a directory"),
        (["--results", "{bad}"], "not valid JSON"),
        (["--results", "{other}"], "not a loadlens benchmark_result.json"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "other.json").write_text('{"schema": "vllm"}')
    paths = {"empty": tmp_path / "empty", "fixture": FIXTURE, "file": tmp_path / "file", "bad": tmp_path / "bad.json",
             "other": tmp_path / "other.json"}  # fmt: skip
    monkeypatch.chdir(tmp_path)
    code = main(["report", *(a.format(**{k: str(v) for k, v in paths.items()}) for a in argv)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("loadlens report: error: ") and err.count("\n") == 1
    assert message in err
    assert not (tmp_path / "report").exists(), "nothing written in the working directory"


class _RecordingClient:
    """Answers every range query with no series, and records the ALERTS query's window."""

    url = "http://127.0.0.1:1"

    def __init__(self) -> None:
        self.alerts_window: tuple[float, float] | None = None

    def query_range(self, expr: str, start: float, end: float, step: int) -> list[dict[str, Any]]:
        if expr == ALERTS_QUERY:
            self.alerts_window = (start, end)
        return []


def test_alerts_are_read_as_far_as_the_verdict_checked(tmp_path: Path) -> None:
    doc = json.loads(FIXTURE.read_text())
    results = parse_results(doc, str(FIXTURE))
    boards = {stem: b for stem, b in dashboards().items() if stem in LOAD_TEST_DASHBOARDS}
    assert results.start == 1795995431.045 and results.end == 1795995503.328
    with_verdict = replace(results, verdict=verdict_view(Verdict.model_validate(VERDICT)))
    client = _RecordingClient()
    path = build_report(client, boards, load_slos(), results.start, results.end, with_verdict, tmp_path)  # type: ignore[arg-type]
    assert client.alerts_window == (1795995431.045, 1795995533.0)  # checked_until 2026-11-29T23:38:53Z
    assert path == tmp_path / "index.html"
    page = path.read_text(encoding="utf-8")
    assert (
        "No alert fired in the window and the 30 s after it the load generator waited for alerts "
        "(to 2026-11-29 23:38:53 UTC)"
    ) in page
    build_report(client, boards, load_slos(), results.start, results.end, results, tmp_path)  # type: ignore[arg-type]
    assert client.alerts_window == (1795995431.045, 1795995503.328)
