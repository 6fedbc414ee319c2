"""``report.html`` of an experiment: its findings, tables, fits and plots (inline SVG by matplotlib when the
``report`` extra is installed; the tables alone otherwise).

Usage::

    page = write_html(result, Path("results/experiments/batching-window-..."))
"""

from __future__ import annotations

import html
import io
from pathlib import Path

from loadlens.contracts.experiment_result import ExperimentResult, Plot, Table

STYLE = (
    "body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
)


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _table(table: Table) -> str:
    head = "".join(
        f"<th>{html.escape(c.label)}{' (' + html.escape(c.unit) + ')' if c.unit else ''}</th>" for c in table.columns
    )
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(row.get(c.key))}</td>" for c in table.columns) + "</tr>" for row in table.rows
    )
    return f"<h2>{html.escape(table.title)}</h2><table><tr>{head}</tr>{body}</table>"


def _svg(result: ExperimentResult, plot: Plot) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for t in result.tables for r in t.rows if isinstance(r.get(plot.x), int | float)]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for key in plot.y:
        pts = sorted((float(r[plot.x]), float(r[key])) for r in rows if isinstance(r.get(key), int | float))  # type: ignore[arg-type]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", label=key)
    fit = next((f for f in result.fits if f.name == plot.fit and f.curve), None)
    if fit is not None:
        ax.plot([c[0] for c in fit.curve], [c[1] for c in fit.curve], "-", label=f"fit (R²={fit.r2:.3f})")
        if fit.optimum_x is not None and fit.optimum_y is not None:
            ax.plot([fit.optimum_x], [fit.optimum_y], "x", markersize=10, label="fitted optimum")
    if plot.log_x:
        ax.set_xscale("log")
    ax.set_xlabel(plot.x_label)
    ax.set_ylabel(plot.y_label)
    ax.set_title(plot.title)
    ax.legend()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def render(result: ExperimentResult) -> str:
    info = result.experiment
    parts = [
        f"<h1>experiment {html.escape(info.name)} ({html.escape(result.run_id)})</h1>",
        f"<p>{html.escape(info.description)}</p>",
        f"<p>{len(result.trials)} trials x {info.repeats} repeats, time scale {info.time_scale}, server "
        f"{html.escape(result.server.mode)} {html.escape(result.server.target or '')}; {result.start_time} .. "
        f"{result.end_time or 'unfinished'}; completed: {'yes' if result.completed else 'no'}</p>",
    ]
    if result.findings:
        items = "".join(
            f"<li><b>{ {True: 'PASS', False: 'FAIL', None: 'n/a'}[f.passed] }</b> {html.escape(f.name)}: "
            f"{html.escape(f.detail)}</li>"
            for f in result.findings
        )
        parts.append(f"<h2>findings</h2><ul>{items}</ul>")
    parts += [_table(t) for t in result.tables]
    for fit in result.fits:
        params = ", ".join(f"{k} = {v:.4g}" for k, v in fit.params.items())
        detail = html.escape(fit.error) if fit.error else f"{params}; R² = {fit.r2:.4f}; {fit.points} points"
        parts.append(f"<h2>fit: {html.escape(fit.y)} = {html.escape(fit.formula)}</h2><p>{detail}</p>")
    for plot in result.plots:
        svg = _svg(result, plot)
        parts.append(svg if svg is not None else f"<p>(plot {html.escape(plot.name)}: matplotlib not installed)</p>")
    failed = [t for t in result.trials if t.status != "done"]
    if failed:
        items = "".join(f"<li>{html.escape(t.name)}: {t.status} {html.escape(t.error or '')}</li>" for t in failed)
        parts.append(f"<h2>unfinished trials</h2><ul>{items}</ul>")
    head = f"<meta charset='utf-8'><title>{html.escape(info.name)}</title><style>{STYLE}</style>"
    return f"<!doctype html><html><head>{head}</head><body>{''.join(parts)}</body></html>\n"


def write_html(result: ExperimentResult, directory: Path) -> Path:
    page = directory / "report.html"
    page.write_text(render(result))
    return page
