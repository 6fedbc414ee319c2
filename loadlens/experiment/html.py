"""``report.html`` of an experiment: the report's experiment page (``loadlens.report.experiment``: findings,
tables, fits, plots as PNG when matplotlib is installed, per-run verdicts), without Prometheus charts;
``loadlens report --results DIR`` draws the same page with them.

Usage::

    page = write_html(result, Path("results/experiments/batching-window-..."))
"""

from __future__ import annotations

from pathlib import Path

from loadlens.contracts.experiment_result import EXPERIMENT_FILE, ExperimentResult
from loadlens.report.experiment import render_experiment_page


def render(result: ExperimentResult, directory: Path | None = None) -> str:
    source = str(directory / EXPERIMENT_FILE) if directory is not None else EXPERIMENT_FILE
    return render_experiment_page(result, source=source)


def write_html(result: ExperimentResult, directory: Path) -> Path:
    page = directory / "report.html"
    page.write_text(render(result, directory), encoding="utf-8")
    return page
