"""The report page: one self-contained HTML file (inline CSS, PNG charts as base64 data URIs, no scripts)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from loadlens.report.results import Results, StageRow

DASH = "–"


@dataclass(frozen=True)
class Chart:
    dashboard: str
    row: str
    title: str
    description: str
    png: bytes
    errors: tuple[str, ...] = ()


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


_CSS = """
body { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px; color: #1f2933; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 2px solid #d9e2ec; }
h3 { margin: 1.2em 0 0.3em; color: #3e4c59; }
table { border-collapse: collapse; margin: 0.6em 0 1em; }
th, td { border: 1px solid #cbd2d9; padding: 4px 10px; text-align: right; }
th { background: #f0f4f8; } td:first-child, th:first-child { text-align: left; }
.meta { color: #52606d; } .chart { margin: 0.8em 0 1.4em; } .chart img { max-width: 100%; }
.desc { color: #52606d; font-size: 0.9em; margin: 0.2em 0; } .err { color: #b42318; font-size: 0.85em; }
"""


def render_page(
    *,
    prometheus: str,
    start: float,
    end: float,
    charts: Sequence[Chart],
    results: Results | None,
    rate_interval: str,
    generated: float,
) -> str:
    parts: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>loadlens report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>loadlens report</h1>",
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
    if results is not None:
        parts.append("<h2>Per stage</h2>")
        parts.append(
            '<p class="desc">From benchmark_result.json: client-side TTFT and output throughput; peak VRAM and GPU '
            "utilisation from the load generator's server-side queries (– when it ran without --prometheus).</p>"
        )
        parts.append('<table class="stages"><thead><tr>')
        parts.extend(f"<th>{escape(c)}</th>" for c in TABLE_COLUMNS)
        parts.append("</tr></thead><tbody>")
        for row in results.rows:
            parts.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in table_cells(row)) + "</tr>")
        parts.append("</tbody></table>")
    dashboard = row_title = None
    for chart in charts:
        if chart.dashboard != dashboard:
            dashboard, row_title = chart.dashboard, None
            parts.append(f"<h2>{escape(chart.dashboard)}</h2>")
        if chart.row != row_title:
            row_title = chart.row
            parts.append(f"<h3>{escape(chart.row)}</h3>")
        data = base64.b64encode(chart.png).decode("ascii")
        parts.append('<div class="chart">')
        parts.append(f'<img alt="{escape(chart.title)}" src="data:image/png;base64,{data}">')
        if chart.description:
            parts.append(f'<p class="desc">{escape(chart.description)}</p>')
        for err in chart.errors:
            parts.append(f'<p class="err">query refused: {escape(err)}</p>')
        parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
