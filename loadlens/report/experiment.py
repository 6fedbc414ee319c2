"""An experiment's ``experiment_result.json`` as a report page: findings, the analysis' tables, each fit with
its parameters and curve, the plots, and every run's verdict; with Prometheus, the dashboards' charts over the
experiment's window with one band per run. The one renderer of experiment results: ``loadlens report
--results EXPERIMENT`` and the ``report.html`` that ``loadlens experiment`` writes both use it.

Usage::

    page = render_experiment_page(result, source="results/experiments/ID/experiment_result.json")
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from loadlens.contracts.experiment_result import (
    EXPERIMENT_FILE,
    ExperimentResult,
    ExperimentResultError,
    Fit,
    Plot,
    Scalar,
    Table,
    parse_experiment_result,
)
from loadlens.report.documents import named_document, read_document
from loadlens.report.html import _CSS, DASH, ChartSection, _alerts, _charts, _table, _utc
from loadlens.report.queries import FiredAlert, Stage

FINDINGS, TABLES, FITS, PLOTS, TRIALS = "findings", "tables", "fits", "plots", "trials"
RUN_COLUMNS = ("Trial", "Status", "Parameters", "Knobs", "Run", "Exit", "Duration (s)", "Verdict", "Headline", "Error")
FIT_COLUMNS = ("Fit", "Formula", "a", "b", "p", "c", "q", "R²", "Points", "Optimum x", "Optimum y", "Interior",
               "Dip below the lower end")  # fmt: skip
FINDING_LABELS = {True: "PASS", False: "FAIL", None: "n/a"}


@dataclass(frozen=True)
class ExperimentChart:
    """One drawn plot of the experiment (PNG), or why it is not drawn."""

    anchor: str
    title: str
    png: bytes | None
    note: str = ""


def cell(value: Scalar) -> str:
    """A table value as shown: ``–`` for null, ``yes``/``no``, whole numbers with thousands separators
    (``1,000,000``), one decimal from 100 up (``753.9``), else 4 significant digits (``36.99``, ``0.0213``)."""
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        if value == round(value) and abs(value) < 1e15:
            return f"{int(value):,}"
        if abs(value) >= 100:
            return f"{value:,.1f}"
        return f"{value:.4g}"
    return str(value)


def _param(value: float | None) -> str:
    return DASH if value is None else f"{value:.4g}"


def table_cells(table: Table) -> list[list[str]]:
    """Each row's cells, in the table's column order, as shown (the tests compare against these)."""
    return [[cell(row.get(c.key)) for c in table.columns] for row in table.rows]


def table_headers(table: Table) -> list[str]:
    return [f"{c.label} ({c.unit})" if c.unit else c.label for c in table.columns]


def fit_cells(fit: Fit) -> list[str]:
    """One fit's row: its parameters (4 significant digits), R² (4 decimals), the optimum, interior, dip."""
    p = fit.params
    return [
        f"{fit.y} vs {fit.x}",
        fit.formula,
        *(_param(p.get(k)) for k in ("a", "b", "p", "c", "q")),
        DASH if fit.r2 is None else f"{fit.r2:.4f}",
        str(fit.points),
        cell(fit.optimum_x),
        cell(fit.optimum_y),
        cell(fit.interior),
        DASH if fit.dip_ratio is None else f"{fit.dip_ratio * 100:.1f} %",
    ]


def run_rows(result: ExperimentResult) -> list[list[str]]:
    """One row per run (repeat) of every trial, in order; a trial without runs (pending, skipped) one row."""
    rows: list[list[str]] = []
    for t in result.trials:
        params = " ".join(f"{k}={cell(v)}" for k, v in t.params.items()) or DASH
        knobs = " ".join(f"{k}={cell(v)}" for k, v in t.knobs.items()) or DASH
        if not t.runs:
            rows.append([t.name, t.status, params, knobs, DASH, DASH, DASH, DASH, DASH, t.error or DASH])
        for r in t.runs:
            verdict = (r.verdict_status or "").upper() or DASH
            rows.append([
                t.name, t.status, params, knobs, r.run_id, str(r.exit_code), f"{r.duration_s:.1f}", verdict,
                r.verdict_headline or DASH, r.error or t.error or DASH,
            ])  # fmt: skip
    return rows


def run_bands(result: ExperimentResult) -> list[Stage]:
    """Each run's window as a band on the charts: ``TRIAL rK``."""
    return [
        Stage(f"{t.name} {r.run_id}", r.start_timestamp, r.end_timestamp)
        for t in result.trials
        for r in t.runs
        if r.end_timestamp > r.start_timestamp
    ]


def window(result: ExperimentResult) -> tuple[float | None, float | None]:
    """From the first run's start to the last run's end (None without runs)."""
    bands = run_bands(result)
    if not bands:
        return None, None
    return min(b.start for b in bands), max(b.end for b in bands)


def _series(plot: Plot, tables: Sequence[Table]) -> list[tuple[str, list[tuple[float, float]]]]:
    """The plot's points from the table holding its x: one series per y key; rows sharing an x (a grid) are
    split by the table's first other column (``max_num_seqs=16``)."""
    table = next((t for t in tables if any(c.key == plot.x for c in t.columns)), None)
    if table is None:
        return []
    xs = [r.get(plot.x) for r in table.rows]
    split = None
    if len(set(xs)) < len(xs):
        split = next((c.key for c in table.columns if c.key != plot.x and c.key not in plot.y), None)
    out: list[tuple[str, list[tuple[float, float]]]] = []
    for key in plot.y:
        groups: dict[str, list[tuple[float, float]]] = {}
        for row in table.rows:
            x, y = row.get(plot.x), row.get(key)
            if isinstance(x, int | float) and isinstance(y, int | float) and not isinstance(y, bool):
                name = key if split is None else f"{key} ({split}={cell(row.get(split))})"
                groups.setdefault(name, []).append((float(x), float(y)))
        out.extend(groups.items())
    return out


def draw_plots(result: ExperimentResult) -> list[ExperimentChart]:
    """Every plot of the result as a PNG (matplotlib, the report's chart style); without matplotlib each is
    named with why it is not drawn."""
    try:
        from loadlens.report.charts import xy_chart
    except ImportError:
        return [ExperimentChart(f"plot-{p.name}", p.title, None, "matplotlib is not installed") for p in result.plots]
    charts: list[ExperimentChart] = []
    for plot in result.plots:
        fit = next((f for f in result.fits if f.name == plot.fit and f.curve), None)
        curve: Sequence[tuple[float, float]] = fit.curve if fit is not None else ()
        label = f"fit {fit.formula} (R² = {fit.r2:.3f})" if fit is not None and fit.r2 is not None else ""
        optimum = None
        if fit is not None and fit.optimum_x is not None and fit.optimum_y is not None:
            optimum = (fit.optimum_x, fit.optimum_y)
        series = _series(plot, result.tables)
        if not series and not curve:
            charts.append(ExperimentChart(f"plot-{plot.name}", plot.title, None, "no points to draw"))
            continue
        png = xy_chart(plot.title, plot.x_label, plot.y_label, series, curve=curve, curve_label=label,
                       optimum=optimum, log_x=plot.log_x)  # fmt: skip
        charts.append(ExperimentChart(f"plot-{plot.name}", plot.title, png))
    return charts


def section_list(result: ExperimentResult, charts: Sequence[ChartSection], prometheus: bool) -> list[tuple[str, str]]:
    out = [(FINDINGS, "Findings"), (TABLES, "Tables")]
    if result.fits:
        out.append((FITS, "Fits"))
    if result.plots:
        out.append((PLOTS, "Plots"))
    out.append((TRIALS, "Trials and their verdicts"))
    if prometheus:
        out.append(("alerts", "Alerts that fired"))
    out.extend((c.anchor, c.title) for c in charts)
    return out


def _findings(result: ExperimentResult) -> list[str]:
    out = [f'<h2 id="{FINDINGS}">Findings</h2>']
    if not result.findings:
        return [*out, '<p class="desc">No findings (the analysis has not run: the experiment did not finish).</p>']
    items = "".join(
        f'<li><strong class="finding-{FINDING_LABELS[f.passed].lower().replace("/", "")}">{FINDING_LABELS[f.passed]}'
        f"</strong> {escape(f.name)}: {escape(f.detail)}</li>"
        for f in result.findings
    )
    return [*out, f'<ul class="findings">{items}</ul>']


def _tables(result: ExperimentResult) -> list[str]:
    out = [f'<h2 id="{TABLES}">Tables</h2>']
    if not result.tables:
        out.append('<p class="desc">No tables (the analysis has not run).</p>')
    for table in result.tables:
        out.append(f'<h3 id="table-{escape(table.name)}">{escape(table.title)}</h3>')
        out.extend(_table(table_headers(table), table_cells(table), f"exp exp-{escape(table.name)}"))
    return out


def _fits(result: ExperimentResult) -> list[str]:
    out = [f'<h2 id="{FITS}">Fits</h2>']
    out.extend(_table(FIT_COLUMNS, [fit_cells(f) for f in result.fits], "exp fits"))
    for fit in result.fits:
        if fit.error:
            out.append(f'<p class="err">fit {escape(fit.name)}: {escape(fit.error)}</p>')
    return out


def _plots(charts: Sequence[ExperimentChart]) -> list[str]:
    out = [f'<h2 id="{PLOTS}">Plots</h2>']
    for chart in charts:
        out.append(f'<div class="chart" id="{escape(chart.anchor)}">')
        if chart.png is None:
            out.append(f'<p class="nodata">{escape(chart.title)}: not drawn ({escape(chart.note)}).</p>')
        else:
            data = base64.b64encode(chart.png).decode("ascii")
            out.append(f'<img alt="{escape(chart.title)}" src="data:image/png;base64,{data}">')
        out.append("</div>")
    return out


def _trials(result: ExperimentResult) -> list[str]:
    out = [
        f'<h2 id="{TRIALS}">Trials and their verdicts</h2>',
        "<p class=\"desc\">One row per run: the trial's swept parameters and knobs, the run's exit status of "
        "loadlens load, and its verdict against the SLO file (each run's own benchmark_result.json).</p>",
    ]
    out.extend(_table(RUN_COLUMNS, run_rows(result), "exp runs"))
    return out


def render_experiment_page(
    result: ExperimentResult,
    *,
    source: str,
    generated: float | None = None,
    prometheus: str | None = None,
    start: float | None = None,
    end: float | None = None,
    sections: Sequence[ChartSection] = (),
    alerts: Sequence[FiredAlert] = (),
    alert_error: str | None = None,
    chart_note: str | None = None,
) -> str:
    """The page: header, contents, findings, tables, fits, plots, per-run verdicts; with ``prometheus`` (it
    answered) the alerts and the dashboards' chart ``sections`` over ``start``–``end``."""
    info = result.experiment
    title = f"loadlens report: experiment {info.name} ({result.run_id})"
    plots = draw_plots(result) if result.plots else []
    parts: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        '<p class="meta">',
        f"{escape(info.description)}<br>" if info.description else "",
        f"{len(result.trials)} trials × {info.repeats} repeats · analysis {escape(info.analysis)} · time scale "
        f"{info.time_scale:g} · users scale {info.users_scale:g} · server {escape(result.server.mode)} "
        f"{escape(result.server.target or '')}<br>",
        f"Started {escape(result.start_time)} · ended {escape(result.end_time or 'unfinished')} · completed: "
        f"{'yes' if result.completed else 'no'}{' · interrupted' if result.interrupted else ''}<br>",
        f"Results {escape(source)}",
    ]
    if generated is not None:
        parts.append(f" · generated {escape(_utc(generated))}")
    if start is not None and end is not None:
        parts.append(f"<br>Window: {escape(_utc(start))} → {escape(_utc(end))} ({end - start:.0f} s)")
    if prometheus is not None:
        parts.append(f" · Prometheus {escape(prometheus)}")
    parts.append("</p>")
    parts.append('<nav class="toc" id="contents"><h2>Contents</h2><ol>')
    parts.extend(
        f'<li><a href="#{escape(a)}">{escape(t)}</a></li>'
        for a, t in section_list(result, sections, prometheus is not None)
    )
    parts.append("</ol></nav>")
    parts.extend(_findings(result))
    parts.extend(_tables(result))
    if result.fits:
        parts.extend(_fits(result))
    if result.plots:
        parts.extend(_plots(plots))
    parts.extend(_trials(result))
    if chart_note:
        parts.append(f'<p class="nodata" id="charts-note">{escape(chart_note)}</p>')
    if prometheus is not None and start is not None and end is not None:
        parts.extend(_alerts(alerts, alert_error, start, end, end))
        for section in sections:
            parts.extend(_charts(section))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def is_experiment_document(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("schema") == "loadlens.experiment_result"


def experiment_file(path: str | Path) -> Path | None:
    """The experiment result ``path`` names (the file, or a directory holding it), None when it names none."""
    return named_document(path, EXPERIMENT_FILE, is_experiment_document)


def load_experiment(file: Path) -> ExperimentResult:
    """Parse ``file``; :class:`ExperimentResultError` names the first bad key."""
    return parse_experiment_result(read_document(file, ExperimentResultError), str(file))
