"""``loadlens report`` on an experiment's result: the findings, every analysis' table (U-curve sweep, burst,
fairness, token-budget grid, slo-search curve), the fits with their parameters, the plots and each run's
verdict, exactly as shown. The results are made by the experiments' own analyses from hand-set figures, so
each cell below is known (guide 4.1's curve is fitted back to its own parameters)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from loadlens.cli import main
from loadlens.contracts.experiment_result import (
    ExperimentInfo,
    ExperimentResult,
    ServerInfo,
    Stat,
    Trial,
    TrialRun,
)
from loadlens.contracts.slo import load_slos
from loadlens.experiment.analysis.analyse import analyse
from loadlens.experiment.html import write_html
from loadlens.experiment.models import Analysis, Search
from loadlens.report.experiment import (
    cell,
    fit_cells,
    render_experiment_page,
    run_bands,
    run_rows,
    table_headers,
)
from loadlens.util.net import free_port

WINDOWS = [10, 25, 50, 100, 150, 200]


def guide(w: float) -> float:
    """Guide 4.1's fitted P99 (ms) at window w (µs)."""
    return float(8.2 + 1240 * w**-0.67 + 0.0013 * w**1.82)


def stat(*values: float) -> Stat:
    return Stat(mean=sum(values) / len(values), n=len(values), values=list(values), min=min(values), max=max(values))


def trial(i: int, name: str, params: dict[str, Any], figures: dict[str, float | Stat], **kw: Any) -> Trial:
    figs = {k: v if isinstance(v, Stat) else stat(v) for k, v in figures.items()}
    return Trial(index=i, name=name, params=params, profile="p", status="done", figures=figs, **kw)


def run(repeat: int, start: float, verdict: str = "pass", **kw: Any) -> TrialRun:
    return TrialRun(repeat=repeat, run_id=f"r{repeat}", result_path="x", log_path="y", exit_code=0, completed=True,
                    start_timestamp=start, end_timestamp=start + 10.0, duration_s=10.25, verdict_status=verdict,
                    verdict_headline=f"{verdict.upper()}: stub", **kw)  # fmt: skip


def result(kind: str, trials: list[Trial]) -> ExperimentResult:
    info = ExperimentInfo(name=f"{kind}-test", source="e.yaml", sha256="0", repeats=1, time_scale=1.0,
                          users_scale=1.0, analysis=kind)  # fmt: skip
    return ExperimentResult(run_id="ci", experiment=info, server=ServerInfo(mode="sim", target="http://sim"),
                            start_time="2026-12-02T00:00:00Z", completed=True, trials=trials)  # fmt: skip


@functools.cache
def _u_curve() -> ExperimentResult:
    trials = [
        trial(
            i,
            f"w{w}",
            {"window": w},
            {"p99_e2el_ms": guide(w), "request_throughput": 1000.0 + w},
            knobs={"batching_window_us": w},
            runs=[run(1, 1_800_000_000.0 + 20 * i)],
        )  # fmt: skip
        for i, w in enumerate(WINDOWS)
    ]
    r = result("u_curve", trials)
    r.trials[2].runs[0].verdict_status, r.trials[2].runs[0].verdict_headline = "fail", "FAIL: TTFT p99 above 200 ms"
    return analyse(Analysis(kind="u_curve", x="window"), load_slos())(r)


def u_curve() -> ExperimentResult:
    """The analysed guide curve (fitted once: the fit is plain Python), a fresh copy per test."""
    return _u_curve().model_copy(deep=True)


def cells_of(page: str, css: str) -> list[list[str]]:
    """The body cells of the page's table with class ``css``, as text."""
    body = page.split(f'<table class="{css}">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body.split("<tbody>", 1)[1], flags=re.S)
    return [re.findall(r"<td>(.*?)</td>", row) for row in rows]


def test_cells_are_shown_as_read() -> None:
    assert [cell(v) for v in (None, True, False, 3, 1_000_000.0, 1234.5678, 36.987, 0.021346, "fcfs")] == [
        "–", "yes", "no", "3", "1,000,000", "1,234.6", "36.99", "0.02135", "fcfs",
    ]  # fmt: skip


def test_u_curve_sweep_fit_and_plots() -> None:
    r = u_curve()
    page = render_experiment_page(r, source="results/experiments/ci/experiment_result.json")
    assert table_headers(r.tables[0]) == [
        "window", "E2E p99 (ms)", "E2E p99 std over repeats (ms)", "fit a + b*x^-p + c*x^q (ms)", "throughput (req/s)",
    ]  # fmt: skip
    assert cells_of(page, "exp exp-sweep") == [
        ["10", "273.4", "–", "273.4", "1,010"],
        ["25", "152.1", "–", "152.1", "1,025"],
        ["50", "99.99", "–", "99.99", "1,050"],
        ["100", "70.55", "–", "70.55", "1,100"],
        ["150", "63.27", "–", "63.27", "1,150"],
        ["200", "63.86", "–", "63.86", "1,200"],
    ]
    # The guide's own parameters come back from its own curve: a, b, p, c, q, R², the optimum at 168.7 µs.
    assert cells_of(page, "exp fits") == [[
        "p99_e2el_ms vs window", "a + b*x^-p + c*x^q", "8.2", "1240", "0.67", "0.0013", "1.82", "1.0000", "6",
        "168.7", "62.83", "yes", "1.6 %",
    ]]  # fmt: skip
    assert cells_of(page, "exp fits") == [fit_cells(r.fits[0])]
    plots = page.split('<h2 id="plots">', 1)[1].split('<h2 id="trials">', 1)[0]
    assert plots.count('src="data:image/png;base64,iVBORw0KGgo') == 2  # the U with its fit, the throughput
    assert '<div class="chart" id="plot-u_curve">' in plots and '<div class="chart" id="plot-throughput">' in plots
    # The fit passes (R² 1 ≥ 0.8) but its dip (1.6 %) is under min_dip: no U judged, as the analysis says.
    findings = page.split('<ul class="findings">', 1)[1].split("</ul>", 1)[0]
    assert '<strong class="finding-pass">PASS</strong> fit_r2: R² = 1.0000 (bound 0.8)' in findings
    assert '<strong class="finding-fail">FAIL</strong> optimum_inside_range: no U' in findings


def test_every_run_has_its_verdict_row() -> None:
    r = u_curve()
    page = render_experiment_page(r, source="e.json")
    rows = cells_of(page, "exp runs")
    assert rows == run_rows(r) and len(rows) == 6
    assert rows[0] == [
        "w10",
        "done",
        "window=10",
        "batching_window_us=10",
        "r1",
        "0",
        "10.2",
        "PASS",
        "PASS: stub",
        "–",
    ]
    assert rows[2][7:] == ["FAIL", "FAIL: TTFT p99 above 200 ms", "–"]
    assert [(b.name, b.start, b.end) for b in run_bands(r)][:2] == [
        ("w10 r1", 1_800_000_000.0, 1_800_000_010.0), ("w25 r1", 1_800_000_020.0, 1_800_000_030.0),
    ]  # fmt: skip


def test_a_skipped_trial_and_a_failed_run_are_shown_with_why() -> None:
    r = u_curve()
    r.trials[5].status, r.trials[5].runs, r.trials[5].error = "skipped", [], "after w150"
    r.trials[4].runs[0].error = "exit status 1"
    rows = cells_of(render_experiment_page(r, source="e.json"), "exp runs")
    assert rows[4][9] == "exit status 1"
    assert rows[5] == ["w200", "skipped", "window=200", "batching_window_us=200", "–", "–", "–", "–", "–", "after w150"]


def test_burst_table_and_threshold() -> None:
    trials = []
    for i, (size, fails) in enumerate([(8, (0.0, 0.0)), (16, (0.0, 0.0)), (32, (0.0, 0.02)), (64, (0.2, 0.3))]):
        trials.append(trial(i, f"b{size}", {"burst": size}, {
            "mean_e2el_ms": 40.0 * size ** 0.5, "p99_e2el_ms": 90.0 * size ** 0.5, "rate_limited_ratio": stat(*fails),
            "server_error_ratio": 0.0, "preemptions_per_request": 0.01 * size,
        }))  # fmt: skip
    r = analyse(Analysis(kind="burst", x="burst", failure={"rate_limited_ratio": 0.01}), load_slos())(
        result("burst", trials)
    )
    page = render_experiment_page(r, source="e.json")
    assert cells_of(page, "exp exp-bursts") == [
        ["8", "113.1", "254.6", "0", "0", "0.08", "0", "0", "0.6576", "–"],
        ["16", "160", "360", "0", "0", "0.16", "0", "0", "0.6576", "–"],
        ["32", "226.3", "509.1", "0.01", "0", "0.32", "0.5", "0.09453", "0.9055", "rate_limited_ratio"],
        ["64", "320", "720", "0.25", "0", "0.64", "1", "0.3424", "1", "rate_limited_ratio"],
    ]
    # 32 fails one repeat of two (0.02 > 0.01): probability 0.5, the first size at it; 16 the last below.
    assert cells_of(page, "exp exp-threshold") == [["32", "16", "32"]]
    assert "Fits" not in page.split("<nav", 1)[1].split("</nav>", 1)[0]  # no fit in a burst analysis


def test_fairness_table() -> None:
    trials = [
        trial(
            i,
            policy,
            {"policy": policy},
            {
                "interactive.p95_e2el_ms": e2e,
                "interactive.p95_ttft_ms": e2e / 4,
                "batch.request_throughput": 2.5,
                "batch.output_throughput": 640.0,
                "jain_fairness_index": jain,
                "interactive.p99_ttft_ms": e2e / 3,
                "batch.p99_ttft_ms": e2e,
            },
        )  # fmt: skip
        for i, (policy, e2e, jain) in enumerate([("fcfs", 400.0, 0.75), ("priority", 300.0, 0.5)])
    ]
    r = analyse(Analysis(kind="fairness"), load_slos())(result("fairness", trials))
    slos = {c.name: c.ttft_seconds * 1000 for c in load_slos().classes}
    assert slos == {"interactive": 200.0, "batch": 2500.0}  # the packaged SLO file the slack ratios use
    assert cells_of(render_experiment_page(r, source="e.json"), "exp exp-fairness") == [
        ["fcfs", "400", "100", "2.5", "640", "0.75", "1.5", "6.25", "1.5"],
        ["priority", "300", "75", "2.5", "640", "0.5", "2", "8.333", "2"],
    ]


def test_token_budget_grid() -> None:
    running = {(16, 64): 9.5, (16, 4096): 15.2, (64, 64): 9.8, (64, 4096): 41.9}
    trials = [
        trial(
            i,
            f"s{s}-t{t}",
            {"max_num_seqs": s, "max_num_batched_tokens": t},
            {
                "sampled.mean_running": m,
                "sampled.mean_waiting": 80 - m,
                "output_throughput": 100 * m,
                "mean_ttft_ms": 1000 / m,
                "p99_ttft_ms": 3000 / m,
            },
        )  # fmt: skip
        for i, ((s, t), m) in enumerate(running.items())
    ]
    r = analyse(Analysis(kind="token_budget"), load_slos())(result("token_budget", trials))
    page = render_experiment_page(r, source="e.json")
    assert cells_of(page, "exp exp-grid") == [
        ["16", "64", "9.5", "70.5", "950", "105.3", "315.8", "yes"],
        ["16", "4,096", "15.2", "64.8", "1,520", "65.79", "197.4", "no"],
        ["64", "64", "9.8", "70.2", "980.0", "102.0", "306.1", "yes"],  # 100 x 9.8 is 980.0000000000001
        ["64", "4,096", "41.9", "38.1", "4,190", "23.87", "71.6", "no"],
    ]
    assert page.count('src="data:image/png;base64,') == 1  # concurrency vs budget, one line per max_num_seqs


def test_slo_search_curve_and_capacity() -> None:
    search = Search(var="level", start=8, max=64)
    levels = [(8, 0.99, "pass"), (16, 0.97, "pass"), (24, 0.95, "pass"), (28, 0.6, "fail"), (32, 0.4, "fail")]
    trials = [
        trial(
            i,
            f"c{lv}",
            {"level": lv},
            {
                "goodput_ratio": g,
                "request_goodput": lv * g,
                "p99_ttft_ms": 5.0 * lv,
                "p99_e2el_ms": 40.0 * lv,
                "error_ratio": 0.0,
            },
            runs=[run(1, 1_800_000_000.0 + 20 * i, verdict, figures={"goodput_ratio": g})],
        )  # fmt: skip
        for i, (lv, g, verdict) in enumerate(levels)
    ]
    r = analyse(Analysis(kind="search"), load_slos(), search)(result("search", trials))
    page = render_experiment_page(r, source="e.json")
    assert cells_of(page, "exp exp-levels") == [
        ["8", "1/1", "1", "0.2065", "1", "0.99", "7.92", "40", "320", "0", "pass", "yes", "no"],
        ["16", "1/1", "1", "0.2065", "1", "0.97", "15.52", "80", "640", "0", "pass", "yes", "no"],
        ["24", "1/1", "1", "0.2065", "1", "0.95", "22.8", "120", "960", "0", "pass", "yes", "no"],
        ["28", "0/1", "0", "0", "0.7935", "0.6", "16.8", "140", "1,120", "0", "fail", "no", "no"],
        ["32", "0/1", "0", "0", "0.7935", "0.4", "12.8", "160", "1,280", "0", "fail", "no", "no"],
    ]
    assert cells_of(page, "exp exp-capacity") == [["24", "28", "0.2065", "1"]]


def write(tmp_path: Path, r: ExperimentResult) -> Path:
    directory = tmp_path / "experiments" / "ci"
    directory.mkdir(parents=True)
    (directory / "experiment_result.json").write_text(json.dumps(r.dump()))
    return directory


def test_report_command_renders_an_experiment_without_prometheus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = write(tmp_path, u_curve())
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the experiment's own part needs no Prometheus
    code = main(["report", "--results", str(directory), "--prometheus", url])
    out, err = capsys.readouterr()
    assert code == 0 and out == f"loadlens report: {directory / 'report' / 'index.html'}\n"
    assert err.startswith(f"loadlens report: warning: cannot reach Prometheus at {url}") and err.count("\n") == 1
    page = (directory / "report" / "index.html").read_text()
    assert f'<p class="nodata" id="charts-note">Charts not drawn: cannot reach Prometheus at {url}' in page
    toc = page.split('<nav class="toc" id="contents">', 1)[1].split("</nav>", 1)[0]
    assert re.findall(r'href="#([^"]+)"', toc) == ["findings", "tables", "fits", "plots", "trials"]
    assert cells_of(page, "exp fits")[0][2:7] == ["8.2", "1240", "0.67", "0.0013", "1.82"]
    # The experiment's own report.html is the same renderer (same tables, fits and verdict rows).
    own = write_html(u_curve(), tmp_path).read_text()
    for css in ("exp exp-sweep", "exp fits", "exp runs"):
        assert cells_of(own, css) == cells_of(page, css)


def test_a_broken_experiment_result_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = u_curve().dump()
    doc["trials"][0]["status"] = "finished"
    directory = tmp_path / "e"
    directory.mkdir()
    (directory / "experiment_result.json").write_text(json.dumps(doc))
    code = main(["report", "--results", str(directory / "experiment_result.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"loadlens report: error: {directory / 'experiment_result.json'}: trials.0.status: ")
