"""Read ``benchmark_result.json`` (the typed model in ``loadlens.contracts.results``) for the report: the run
window, stage bands, the table, the verdict.

The verdict is read attribute by attribute with defaults (:func:`verdict_view`), so the report renders what a
results file holds even where it lacks a field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadlens.contracts.results import RESULT_FILE, ResultsError, ServerFigures, parse_result
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


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """An attribute of a model, or a key of a plain dict; ``default`` when absent or None."""
    value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return default if value is None else value


def _opt_float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _timestamp(text: Any) -> float | None:
    """ISO 8601 (``2026-11-29T23:38:53Z``; no offset = UTC) -> Unix seconds, None when not one."""
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp()


def verdict_view(verdict: Any) -> VerdictView | None:
    """The report's view of a results file's ``verdict`` (the typed model or a plain dict); None when absent."""
    if verdict is None:
        return None
    slos = tuple(
        SLORow(
            slo=str(_get(c, "slo", "?")),
            priority_class=_opt_str(_get(c, "priority_class")),
            stage=str(_get(c, "stage", "")),
            statistic=str(_get(c, "statistic", "")),
            comparison=str(_get(c, "comparison", "<=")),
            threshold=_opt_float(_get(c, "threshold")),
            observed=_opt_float(_get(c, "observed")),
            unit=str(_get(c, "unit", "")),
            passed=_get(c, "passed") if isinstance(_get(c, "passed"), bool) else None,
        )
        for c in _get(verdict, "slos", [])
    )
    pages = tuple(
        PageRow(
            alertname=str(_get(p, "alertname", "?")),
            severity=_opt_str(_get(p, "severity")),
            receiver=str(_get(p, "receiver", "")),
            status=str(_get(p, "status", "")),
            at=str(_get(p, "at", "")),
        )
        for p in _get(verdict, "pages", [])
    )
    alerts = tuple(
        VerdictAlertRow(
            alertname=str(_get(a, "alertname", "?")),
            severity=_opt_str(_get(a, "severity")),
            state=str(_get(a, "state", "")),
            starts_at=_opt_str(_get(a, "starts_at")),
            ends_at=_opt_str(_get(a, "ends_at")),
        )
        for a in _get(verdict, "alerts", [])
    )
    window = _get(verdict, "window")
    return VerdictView(
        status=str(_get(verdict, "status", "unknown")),
        headline=str(_get(verdict, "headline", "")),
        slos=slos,
        pages=pages,
        alerts=alerts,
        checked_until=_opt_str(_get(window, "checked_until")) if window is not None else None,
        checked_until_timestamp=_timestamp(_get(window, "checked_until")) if window is not None else None,
        pages_source=_opt_str(_get(verdict, "pages_source")),
        errors=tuple(str(e) for e in _get(verdict, "errors", [])),
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
        verdict=verdict_view(getattr(result, "verdict", None)),
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
