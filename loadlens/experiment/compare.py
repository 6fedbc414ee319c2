"""``loadlens compare RESULT...``: runs side by side (the guide's first table is two configurations), each
figure with its difference to the first (the baseline) and whether that difference is significant.

A RESULT is a ``benchmark_result.json`` (or its run directory): one column; or an ``experiment_result.json``
(or its directory): one column per finished trial. Significance is Welch's t-test on means: for one run,
from the run's own samples (``mean``/``std``/``samples`` of TTFT, TPOT, ITL, E2E); for experiment trials
with ≥ 2 repeats, over the repeats' values of every figure. Figures without a spread (percentiles and
throughputs of single runs) get no p-value. docs/experiments.md, *Compare*.

Usage::

    loadlens compare results/run-a results/run-b --html compare.html
"""

from __future__ import annotations

import argparse
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadlens.contracts.experiment_result import EXPERIMENT_FILE, ExperimentResultError, parse_experiment_result
from loadlens.contracts.results import RESULT_FILE, ResultsError, parse_result
from loadlens.experiment.analysis.stats import welch
from loadlens.experiment.figures import extract_figures
from loadlens.util.cliutil import UsageError

DEFAULT_FIGURES = [
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
    "request_throughput",
    "output_throughput",
    "goodput_ratio",
    "error_ratio",
    "server.peak_vram_gib",
]
# A training experiment's trials (loadlens/experiment/training/figures.py) have none of the above: these instead.
TRAINING_FIGURES = [
    "crashed", "convergence_step", "final_val_loss", "grad_norm_std", "lora_a_grad_norm_std", "lora_b_grad_norm_std",
    "grad_norm_jumps", "memory_fluctuation_max", "ab_correlation_min", "checkpoints_saved", "train_seconds",
]  # fmt: skip
SAMPLED = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2el"}
ALPHA = 0.05


@dataclass
class Column:
    label: str
    source: str
    figures: dict[str, float | None]
    spread: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    """figure -> (mean, std, n) where a significance test is possible."""


def _resolve(path: Path) -> Path:
    if path.is_dir():
        for name in (EXPERIMENT_FILE, RESULT_FILE):
            if (path / name).is_file():
                return path / name
        raise UsageError(f"{path}: no {RESULT_FILE} or {EXPERIMENT_FILE} in this directory")
    if not path.is_file():
        raise UsageError(f"{path}: no such file or directory")
    return path


def load_columns(arg: str) -> list[Column]:
    path = _resolve(Path(arg))
    try:
        doc: Any = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"{path}: not JSON: {err}") from None
    if isinstance(doc, dict) and doc.get("schema") == "loadlens.experiment_result":
        try:
            exp = parse_experiment_result(doc, str(path))
        except ExperimentResultError as err:
            raise UsageError(str(err)) from None
        cols = []
        for t in exp.trials:
            if t.status != "done":
                continue
            figs = {k: s.mean for k, s in t.figures.items()}
            spreads = {
                k: (s.mean, s.std, s.n) for k, s in t.figures.items() if s.mean is not None and s.std is not None
            }
            cols.append(Column(f"{exp.run_id}/{t.name}", str(path), figs, spreads))
        if not cols:
            raise UsageError(f"{path}: the experiment has no finished trial")
        return cols
    try:
        parse_result(doc, str(path))
    except ResultsError as err:
        raise UsageError(str(err)) from None
    figs = extract_figures(doc)
    overall = doc.get("overall", {})
    spread: dict[str, tuple[float, float, int]] = {}
    for m in SAMPLED:
        mean, std, n = overall.get(f"mean_{m}_ms"), overall.get(f"std_{m}_ms"), overall.get(f"{m}_samples")
        if isinstance(mean, int | float) and isinstance(std, int | float) and isinstance(n, int):
            spread[f"mean_{m}_ms"] = (float(mean), float(std), n)
    return [Column(str(doc.get("run", {}).get("run_id") or path.parent.name), str(path), figs, spread)]


@dataclass
class Cell:
    value: float | None
    delta: float | None = None
    ratio: float | None = None
    p_value: float | None = None

    @property
    def significant(self) -> bool | None:
        return None if self.p_value is None else self.p_value < ALPHA


def compare(columns: list[Column], figures: list[str]) -> list[tuple[str, list[Cell]]]:
    """Per figure, a cell per column: the value, and against the first column its difference, relative
    difference and the p-value of Welch's test where both have a spread."""
    base = columns[0]
    out: list[tuple[str, list[Cell]]] = []
    for key in figures:
        cells = []
        b = base.figures.get(key)
        for i, col in enumerate(columns):
            v = col.figures.get(key)
            cell = Cell(v)
            if i and v is not None and b is not None:
                cell.delta = v - b
                cell.ratio = (v - b) / b if b else None
                if key in base.spread and key in col.spread:
                    test = welch(*col.spread[key], *base.spread[key])
                    cell.p_value = test.p_value if test is not None else None
            cells.append(cell)
        out.append((key, cells))
    return out


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def format_text(columns: list[Column], rows: list[tuple[str, list[Cell]]]) -> str:
    heads = ["figure", f"{columns[0].label} (baseline)"]
    for col in columns[1:]:
        heads += [col.label, "delta", "delta %", "p"]
    body = []
    for key, cells in rows:
        line = [key, _num(cells[0].value)]
        for c in cells[1:]:
            mark = "*" if c.significant else ""
            pct = "-" if c.ratio is None else f"{c.ratio * 100:+.1f}"
            line += [_num(c.value), "-" if c.delta is None else f"{c.delta:+.4g}", pct, _num(c.p_value) + mark]
        body.append(line)
    widths = [max(len(r[i]) for r in [heads, *body]) for i in range(len(heads))]
    lines = [" ".join(h.rjust(w) for h, w in zip(r, widths, strict=True)) for r in [heads, *body]]
    return "\n".join(lines) + f"\n* p < {ALPHA} (Welch's t-test on means; '-': no spread to test)"


def render_html(columns: list[Column], rows: list[tuple[str, list[Cell]]]) -> str:
    head = "<th>figure</th>" + "".join(
        f"<th>{html.escape(c.label)}{' (baseline)' if i == 0 else ''}</th>" for i, c in enumerate(columns)
    )
    body = ""
    for key, cells in rows:
        tds = f"<td>{html.escape(key)}</td><td>{_num(cells[0].value)}</td>"
        for c in cells[1:]:
            pct = "" if c.ratio is None else f" ({c.ratio * 100:+.1f} %)"
            sig = "" if c.p_value is None else f"<br>p = {c.p_value:.3g}{' *' if c.significant else ''}"
            style = " style='background:#fde'" if c.significant else ""
            tds += f"<td{style}>{_num(c.value)}<br>{'' if c.delta is None else f'{c.delta:+.4g}'}{pct}{sig}</td>"
        body += f"<tr>{tds}</tr>"
    sources = "".join(f"<li>{html.escape(c.label)}: {html.escape(c.source)}</li>" for c in columns)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>loadlens compare</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}</style></head><body>"
        f"<h1>compare</h1><ul>{sources}</ul><table><tr>{head}</tr>{body}</table>"
        f"<p>differences against the first column; * p &lt; {ALPHA} (Welch's t-test on means)</p></body></html>\n"
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compare",
        help="results side by side: each figure, its difference to the first and its significance",
        description="Put benchmark_result.json runs and experiment trials side by side (docs/experiments.md).",
    )
    p.add_argument("results", nargs="+", help="benchmark_result.json / experiment_result.json files or run directories")
    p.add_argument("--figures", help=f"comma-separated figure keys (default: {','.join(DEFAULT_FIGURES)})")
    p.add_argument("--html", type=Path, help="also write the comparison as an HTML page to this file")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    columns = [c for arg in args.results for c in load_columns(arg)]
    labels = [c.label for c in columns]
    for c in columns:  # two runs named alike (r1 of two experiments): name them by their directory too
        if labels.count(c.label) > 1:
            c.label = f"{Path(c.source).parent.parent.name}/{c.label}"
    if len(columns) < 2:
        raise UsageError("give at least two results (or an experiment with two finished trials)")
    known = {k for c in columns for k in c.figures}
    default = DEFAULT_FIGURES if known & set(DEFAULT_FIGURES) or not known & set(TRAINING_FIGURES) else TRAINING_FIGURES
    figures = [f.strip() for f in args.figures.split(",") if f.strip()] if args.figures else default
    unknown = [f for f in figures if f not in known and args.figures]
    if unknown:
        raise UsageError(f"--figures: no result has {unknown[0]!r} (e.g. {', '.join(sorted(known)[:8])}, ...)")
    rows = compare(columns, figures)
    print(format_text(columns, rows))
    if args.html:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(render_html(columns, rows))
        print(f"page: {args.html}")
    return 0
