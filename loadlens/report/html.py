"""The report page: one self-contained HTML file (inline CSS, PNG charts as base64 data URIs, no scripts)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from loadlens.report.queries import FiredAlert
from loadlens.report.results import Results, SLORow, StageRow, VerdictView
from loadlens.report.sections import ALERTS, SECTION_TITLES, STAGES, VERDICT

DASH = "–"


@dataclass(frozen=True)
class Chart:
    """One drawn panel: its HTML id, where it comes from (dashboard and row), its PNG."""

    anchor: str
    dashboard: str
    row: str
    title: str
    description: str
    png: bytes
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChartSection:
    """One question's charts, and the panels it did not draw: flat at 0 throughout, or without data."""

    anchor: str
    title: str
    intro: str
    charts: tuple[Chart, ...]
    flat: tuple[str, ...] = ()
    empty: tuple[str, ...] = ()


def fmt(value: float | None, digits: int) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:.1f} %"


TABLE_COLUMNS = (
    "Stage",
    "TTFT mean (ms)",
    "TTFT p99 (ms)",
    "Output tok/s",
    "Peak VRAM (GiB)",
    "GPU util. mean",
    "GPU util. peak-to-trough",
)


def table_cells(row: StageRow) -> list[str]:
    """The table's cells for one stage, as shown (the tests compare against these)."""
    return [
        row.stage if not row.warmup or "warmup" in row.stage else f"{row.stage} (warmup)",
        fmt(row.mean_ttft_ms, 2),
        fmt(row.p99_ttft_ms, 2),
        fmt(row.output_throughput, 1),
        fmt(row.peak_vram_gib, 2),
        pct(row.mean_gpu_utilization_ratio),
        pct(row.gpu_utilization_peak_to_trough_ratio),
    ]


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%H:%M:%S")


def _iso(text: str | None) -> str:
    """An ISO 8601 time from the results file, as the page shows it (``2026-11-29 23:37:41 UTC``)."""
    if not text:
        return DASH
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return text
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return _utc(parsed.timestamp())


def section_list(results: Results | None, charts: Sequence[ChartSection]) -> list[tuple[str, str]]:
    """The page's sections in order, as (anchor, heading): verdict, alerts, the per-stage table (with a
    results file), then each question that has a panel. The table of contents lists exactly these."""
    out = [(VERDICT, SECTION_TITLES[VERDICT]), (ALERTS, SECTION_TITLES[ALERTS])]
    if results is not None:
        out.append((STAGES, SECTION_TITLES[STAGES]))
    out.extend((c.anchor, c.title) for c in charts)
    return out


COMPARISONS = {"<=": "≤", ">=": "≥"}
SLO_COLUMNS = ("SLO", "Class", "Stage", "Objective", "Observed", "Result")
PAGE_COLUMNS = ("Alert", "Severity", "Receiver", "Status", "Received")
ALERT_COLUMNS = ("Alert", "Severity", "Labels", "Fired", "Resolved", "Firing for")


def _slo_value(value: float | None, unit: str) -> str:
    if value is None:
        return DASH
    if unit == "ratio":
        return f"{value * 100:.2f} %"
    return f"{value:.2f} {unit}".rstrip()


def slo_cells(row: SLORow) -> list[str]:
    """One row of the verdict's SLO table, as shown: ``TTFT``, ``interactive``, ``c16``, ``p99 ≤ 200.00 ms``,
    ``212.40 ms``, ``FAIL`` (``–`` where nothing could be judged)."""
    objective = (
        f"{row.statistic} {COMPARISONS.get(row.comparison, row.comparison)} {_slo_value(row.threshold, row.unit)}"
    )
    result = DASH if row.passed is None else ("pass" if row.passed else "FAIL")
    return [
        row.slo.upper() if len(row.slo) <= 4 else row.slo,
        row.priority_class or "all",
        row.stage,
        objective.strip(),
        _slo_value(row.observed, row.unit),
        result,
    ]


def alert_cells(alert: FiredAlert, start: float) -> list[str]:
    """One row of the fired-alerts table: name, severity, other labels, from, to, duration."""
    fired = f"{_clock(alert.start)} (t+{alert.start - start:.0f} s)"
    if alert.open_start:
        fired += ", already firing at the start"
    when = f"{_clock(alert.end)} (t+{alert.end - start:.0f} s)"
    resolved = f"still firing at {when}" if alert.open_end else when
    return [
        alert.name,
        alert.severity or DASH,
        " ".join(f"{k}={v}" for k, v in alert.labels) or DASH,
        fired,
        resolved,
        f"{alert.duration:.0f} s",
    ]


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], css: str) -> list[str]:
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    out = [f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>']
    for cells in rows:
        out.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table>")
    return out


def _verdict(results: Results | None) -> list[str]:
    out = [f'<h2 id="{VERDICT}">{SECTION_TITLES[VERDICT]}</h2>']
    verdict: VerdictView | None = results.verdict if results is not None else None
    if results is None:
        out.append('<p class="verdict verdict-none">No verdict: the report was made without --results.</p>')
        return out
    if verdict is None:
        out.append(
            '<p class="verdict verdict-none">No verdict in the results file (written before the load generator '
            "judged runs); the alerts below come from Prometheus.</p>"
        )
        return out
    status = verdict.status.upper()
    headline = verdict.headline
    if headline.upper().startswith(f"{status}:"):  # the badge already says it
        headline = headline[len(status) + 1 :].strip()
    out.append(
        f'<p class="verdict verdict-{escape(verdict.status)}"><strong>{escape(status)}</strong> {escape(headline)}</p>'
    )
    if verdict.slos:
        failed = sum(1 for r in verdict.slos if r.passed is False)
        out.append(
            f'<p class="desc">{len(verdict.slos)} SLO checks from the SLO file, {failed} failed (failures first); '
            "judged by the load generator on the client's figures.</p>"
        )
        ordered = sorted(verdict.slos, key=lambda r: 0 if r.passed is False else 1)
        out.extend(_table(SLO_COLUMNS, [slo_cells(r) for r in ordered], "slos"))
    else:
        out.append('<p class="desc">No SLO checks in the verdict.</p>')
    if verdict.pages:
        out.append(f"<h3>Pages ({len(verdict.pages)})</h3>")
        pages = [[p.alertname, p.severity or DASH, p.receiver, p.status, _iso(p.at)] for p in verdict.pages]
        out.extend(_table(PAGE_COLUMNS, pages, "pages"))
    elif verdict.pages_source:
        out.append(f'<p class="desc">No page reached the pager ({escape(verdict.pages_source)}).</p>')
    else:
        out.append('<p class="desc">Pages were not checked (the load generator had no pager to ask).</p>')
    if verdict.alerts:
        seen = ", ".join(f"{a.alertname} ({a.state})" for a in verdict.alerts)
        until = f" up to {_iso(verdict.checked_until)}" if verdict.checked_until else ""
        out.append(f'<p class="desc">Alerts the load generator saw{escape(until)}: {escape(seen)}.</p>')
    for err in verdict.errors:
        out.append(f'<p class="err">verdict: {escape(err)}</p>')
    return out


def _alerts(alerts: Sequence[FiredAlert], alert_error: str | None, start: float, end: float, until: float) -> list[str]:
    out = [f'<h2 id="{ALERTS}">{SECTION_TITLES[ALERTS]}</h2>']
    where = "in the window"
    if until > end:
        where += f" and the {until - end:.0f} s after it the load generator waited for alerts (to {_utc(until)})"
    if alert_error is not None:
        out.append(f'<p class="err">ALERTS query refused: {escape(alert_error)}</p>')
    elif not alerts:
        out.append(f'<p class="desc">No alert fired {escape(where)} (Prometheus ALERTS{{alertstate="firing"}}).</p>')
    else:
        names = sorted({a.name for a in alerts})
        out.append(
            f'<p class="desc">{len(alerts)} firing intervals of {len(names)} alerts {escape(where)}, from Prometheus '
            'ALERTS{alertstate="firing"}; each is shaded on every chart below (red: critical, orange: warning).</p>'
        )
        out.extend(_table(ALERT_COLUMNS, [alert_cells(a, start) for a in alerts], "alerts"))
    return out


def _stages(results: Results) -> list[str]:
    out = [
        f'<h2 id="{STAGES}">{SECTION_TITLES[STAGES]}</h2>',
        '<p class="desc">From benchmark_result.json: client-side TTFT and output throughput; peak VRAM and GPU '
        "utilisation from the load generator's server-side queries (– when it ran without --prometheus).</p>",
    ]
    out.extend(_table(TABLE_COLUMNS, [table_cells(r) for r in results.rows], "stages"))
    return out


def _names(titles: Sequence[str]) -> str:
    return ", ".join(escape(t) for t in titles)


def _charts(section: ChartSection) -> list[str]:
    out = [f'<h2 id="{escape(section.anchor)}">{escape(section.title)}</h2>']
    out.append(f'<p class="desc">{escape(section.intro)}</p>')
    if section.flat:
        out.append(
            f'<p class="nothing" id="{escape(section.anchor)}-nothing"><strong>Nothing happened</strong> '
            f"(0 throughout the window, not drawn): {_names(section.flat)}.</p>"
        )
    if section.empty:
        out.append(
            f'<p class="nodata" id="{escape(section.anchor)}-nodata"><strong>No data</strong> '
            f"(no series in this window, not drawn): {_names(section.empty)}.</p>"
        )
    for chart in section.charts:
        data = base64.b64encode(chart.png).decode("ascii")
        out.append(f'<div class="chart" id="{escape(chart.anchor)}">')
        out.append(f'<img alt="{escape(chart.title)}" src="data:image/png;base64,{data}">')
        desc = f"{chart.description} " if chart.description else ""
        out.append(
            f'<p class="desc">{escape(desc)}'
            f'<span class="src">({escape(chart.dashboard)} › {escape(chart.row)})</span></p>'
        )
        for err in chart.errors:
            out.append(f'<p class="err">query refused: {escape(err)}</p>')
        out.append("</div>")
    return out


def _toc(results: Results | None, charts: Sequence[ChartSection]) -> list[str]:
    by_anchor = {c.anchor: c for c in charts}
    out = ['<nav class="toc" id="contents"><h2>Contents</h2><ol>']
    for anchor, title in section_list(results, charts):
        out.append(f'<li><a href="#{escape(anchor)}">{escape(title)}</a>')
        section = by_anchor.get(anchor)
        if section is not None and section.charts:
            out.append('<ol class="charts">')
            out.extend(f'<li><a href="#{escape(c.anchor)}">{escape(c.title)}</a></li>' for c in section.charts)
            out.append("</ol>")
        out.append("</li>")
    out.append("</ol></nav>")
    return out


_CSS = """
body { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px; color: #1f2933; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 2px solid #d9e2ec; }
h3 { margin: 1.2em 0 0.3em; color: #3e4c59; }
table { border-collapse: collapse; margin: 0.6em 0 1em; }
th, td { border: 1px solid #cbd2d9; padding: 4px 10px; text-align: right; }
th { background: #f0f4f8; } td:first-child, th:first-child { text-align: left; }
table.alerts td, table.pages td, table.slos td { text-align: left; }
.meta { color: #52606d; } .chart { margin: 0.8em 0 1.4em; } .chart img { max-width: 100%; }
.desc { color: #52606d; font-size: 0.9em; margin: 0.2em 0; } .err { color: #b42318; font-size: 0.85em; }
.src { color: #7b8794; } .toc ol { margin: 0.2em 0; } .toc ol.charts { font-size: 0.85em; columns: 2; }
.verdict { font-size: 1.15em; padding: 0.5em 0.8em; border-left: 6px solid #9aa5b1; background: #f5f7fa; }
.verdict-pass { border-color: #2f9e44; } .verdict-fail { border-color: #d62728; }
.verdict-unknown { border-color: #f59f00; }
.nothing, .nodata { background: #f5f7fa; padding: 0.4em 0.8em; font-size: 0.9em; }
"""


def render_page(
    *,
    prometheus: str,
    start: float,
    end: float,
    sections: Sequence[ChartSection],
    results: Results | None,
    rate_interval: str,
    generated: float,
    alerts: Sequence[FiredAlert] = (),
    alert_error: str | None = None,
    alerts_end: float | None = None,
) -> str:
    """The page: header, table of contents, then the sections of :func:`section_list` in that order."""
    title = "loadlens report"
    if results is not None:
        title += f": {results.run_id}"
        if results.verdict is not None:
            title += f" ({results.verdict.status.upper()})"
    parts: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        '<p class="meta">',
        f"Window: {escape(_utc(start))} → {escape(_utc(end))} ({end - start:.0f} s)<br>",
        f"Prometheus: {escape(prometheus)} · rate window {escape(rate_interval)} · generated {escape(_utc(generated))}",
    ]
    if results is not None:
        parts.append(
            f"<br>Run: {escape(results.run_id)} · model {escape(results.model)} · profile {escape(results.profile)}"
            f" · results {escape(results.source)}"
        )
    parts.append("</p>")
    parts.extend(_toc(results, sections))
    parts.extend(_verdict(results))
    parts.extend(_alerts(alerts, alert_error, start, end, max(end, alerts_end or end)))
    if results is not None:
        parts.extend(_stages(results))
    for section in sections:
        parts.extend(_charts(section))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
