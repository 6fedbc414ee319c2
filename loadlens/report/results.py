"""Read ``benchmark_result.json`` (the typed model in ``loadlens.contracts.results``) for the report: the run
window, stage bands, the table, the verdict.

The verdict (``loadlens.contracts.results.Verdict``, written by the load generator) becomes the rows the page
shows (:func:`verdict_view`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadlens.contracts.results import RESULT_FILE, ResultsError, ServerFigures, Verdict, parse_result
from loadlens.report.queries import Stage


@dataclass(frozen=True)
class StageRow:
    """One row of the guide-style table; ``None`` where the figure does not exist."""

    stage: str
    warmup: bool
    mean_ttft_ms: float | None
    p99_ttft_ms: float | None
    output_throughput: float | None
    peak_vram_gib: float | None
    mean_gpu_utilization_ratio: float | None
    gpu_utilization_peak_to_trough_ratio: float | None


@dataclass(frozen=True)
class SLORow:
    """One SLO judged on one stage (and class): ``passed`` is None where nothing could be judged."""

    slo: str
    priority_class: str | None
    stage: str
    statistic: str
    comparison: str
    threshold: float | None
    observed: float | None
    unit: str
    passed: bool | None


@dataclass(frozen=True)
class PageRow:
    alertname: str
    severity: str | None
    receiver: str
    status: str
    at: str


@dataclass(frozen=True)
class VerdictAlertRow:
    alertname: str
    severity: str | None
    state: str
    starts_at: str | None
    ends_at: str | None


@dataclass(frozen=True)
class VerdictView:
    """What the report shows of ``verdict`` (docs/loadgen.md)."""

    status: str  # pass | fail | unknown
    headline: str
    slos: tuple[SLORow, ...] = ()
    pages: tuple[PageRow, ...] = ()
    alerts: tuple[VerdictAlertRow, ...] = ()
    checked_until: str | None = None
    checked_until_timestamp: float | None = None  # the same instant, Unix seconds (None if absent or unparsable)
    pages_source: str | None = None
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Results:
    run_id: str
    model: str
    profile: str
    start: float | None
    end: float | None
    stages: tuple[Stage, ...]
    rows: tuple[StageRow, ...]
    source: str
    verdict: VerdictView | None = None


def _timestamp(text: str | None) -> float | None:
    """ISO 8601 (``2026-11-29T23:38:53Z``; no offset = UTC) -> Unix seconds, None when absent or not one."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp()


def verdict_view(verdict: Verdict | None) -> VerdictView | None:
    """What the report shows of a results file's ``verdict``; None when the file has none."""
    if verdict is None:
        return None
    return VerdictView(
        status=verdict.status,
        headline=verdict.headline,
        slos=tuple(
            SLORow(
                slo=c.slo,
                priority_class=c.priority_class,
                stage=c.stage,
                statistic=c.statistic,
                comparison=c.comparison,
                threshold=c.threshold,
                observed=c.observed,
                unit=c.unit,
                passed=c.passed,
            )
            for c in verdict.slos
        ),
        pages=tuple(PageRow(p.alertname, p.severity, p.receiver, p.status, p.at) for p in verdict.pages),
        alerts=tuple(VerdictAlertRow(a.alertname, a.severity, a.state, a.starts_at, a.ends_at) for a in verdict.alerts),
        checked_until=verdict.window.checked_until,
        checked_until_timestamp=_timestamp(verdict.window.checked_until),
        pages_source=verdict.pages_source,
        errors=tuple(verdict.errors),
    )


def parse_results(doc: Any, source: str = "<memory>") -> Results:
    result = parse_result(doc, source)
    stages: list[Stage] = []
    rows: list[StageRow] = []
    for st in result.stages:
        t0, t1 = st.start_timestamp, st.end_timestamp
        if t0 is not None and t1 is not None and t1 > t0:
            stages.append(Stage(st.name, t0, t1, st.warmup))
        server = st.server or ServerFigures()
        rows.append(
            StageRow(
                stage=st.name,
                warmup=st.warmup,
                mean_ttft_ms=st.mean_ttft_ms,
                p99_ttft_ms=st.p99_ttft_ms,
                output_throughput=st.output_throughput,
                peak_vram_gib=server.peak_vram_gib,
                mean_gpu_utilization_ratio=server.mean_gpu_utilization_ratio,
                gpu_utilization_peak_to_trough_ratio=server.gpu_utilization_peak_to_trough_ratio,
            )
        )
    start, end = result.run.start_timestamp, result.run.end_timestamp
    if start is None and stages:
        start = stages[0].start
    if end is None and stages:
        end = stages[-1].end
    return Results(
        run_id=result.run.run_id,
        model=result.run.model,
        profile=result.run.profile,
        start=start,
        end=end,
        stages=tuple(stages),
        rows=tuple(rows),
        source=source,
        verdict=verdict_view(result.verdict),
    )


def results_file(path: str | Path) -> Path:
    """``--results`` as given: the JSON file itself, or a run directory holding ``benchmark_result.json``."""
    given = Path(path)
    if given.is_dir():
        file = given / RESULT_FILE
        if not file.is_file():
            raise ResultsError(f"{given} is a directory without a {RESULT_FILE} (give the run's directory or the file)")
        return file
    return given


def load_results(path: str | Path) -> Results:
    """Parse ``path`` (a file, or a run directory: see :func:`results_file`)."""
    file = results_file(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise ResultsError(f"cannot read results file {file}: {err.strerror}") from None
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise ResultsError(f"{file}: not valid JSON: {err}") from None
    return parse_results(doc, str(file))
