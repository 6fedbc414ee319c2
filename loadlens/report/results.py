"""Read ``benchmark_result.json`` (docs/loadgen.md) for the report: the run window, stage bands, the table."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadlens.report.queries import Stage


class ResultsError(ValueError):
    """The results file is missing, not JSON or not a loadlens benchmark result."""


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


def _num(doc: Any, key: str) -> float | None:
    if not isinstance(doc, dict):
        return None
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def parse_results(doc: Any, source: str = "<memory>") -> Results:
    if not isinstance(doc, dict) or doc.get("schema") != "loadlens.benchmark_result":
        raise ResultsError(f"{source}: not a loadlens benchmark_result.json (schema is not loadlens.benchmark_result)")
    raw_stages = doc.get("stages")
    if not isinstance(raw_stages, list):
        raise ResultsError(f"{source}: stages must be a list")
    raw_run = doc.get("run")
    run: dict[str, Any] = raw_run if isinstance(raw_run, dict) else {}
    stages: list[Stage] = []
    rows: list[StageRow] = []
    for i, st in enumerate(raw_stages):
        if not isinstance(st, dict):
            raise ResultsError(f"{source}: stages[{i}] must be an object")
        name = str(st.get("name", f"stage {i}"))
        warmup = bool(st.get("warmup", False))
        t0, t1 = _num(st, "start_timestamp"), _num(st, "end_timestamp")
        if t0 is not None and t1 is not None and t1 > t0:
            stages.append(Stage(name, t0, t1, warmup))
        server = st.get("server")
        rows.append(
            StageRow(
                stage=name,
                warmup=warmup,
                mean_ttft_ms=_num(st, "mean_ttft_ms"),
                p99_ttft_ms=_num(st, "p99_ttft_ms"),
                output_throughput=_num(st, "output_throughput"),
                peak_vram_gib=_num(server, "peak_vram_gib"),
                mean_gpu_utilization_ratio=_num(server, "mean_gpu_utilization_ratio"),
                gpu_utilization_peak_to_trough_ratio=_num(server, "gpu_utilization_peak_to_trough_ratio"),
            )
        )
    start = _num(run, "start_timestamp")
    end = _num(run, "end_timestamp")
    if start is None and stages:
        start = stages[0].start
    if end is None and stages:
        end = stages[-1].end
    return Results(
        run_id=str(run.get("run_id", "")),
        model=str(run.get("model", "")),
        profile=str(run.get("profile", "")),
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
