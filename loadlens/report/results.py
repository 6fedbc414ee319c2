"""Read ``benchmark_result.json`` (the typed model in ``loadlens.contracts.results``) for the report: the run
window, stage bands, the table."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadlens.contracts.results import ResultsError, ServerFigures, parse_result
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
class Results:
    run_id: str
    model: str
    profile: str
    start: float | None
    end: float | None
    stages: tuple[Stage, ...]
    rows: tuple[StageRow, ...]
    source: str


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
    )


def load_results(path: str | Path) -> Results:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise ResultsError(f"cannot read results file {file}: {err.strerror}") from None
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise ResultsError(f"{file}: not valid JSON: {err}") from None
    return parse_results(doc, str(file))
