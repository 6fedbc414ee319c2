"""The one table printed at the end of a run: a row per stage and ``overall``, every column named with its
statistic and unit, from ``benchmark_result.json``.

Locust's own end-of-run tables are not printed (the locustfile silences them): their *Aggregated* row adds
the TTFT, TPOT and E2E events of every request into one column (three "requests" per request) and their
percentiles are rounded. This table is the run's figures as the result file holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loadgen.workload import summary_lines as workload_summary

Column = tuple[str, int, Callable[[Mapping[str, Any]], str]]


def _num(key: str, spec: str, scale: float = 1.0) -> Callable[[Mapping[str, Any]], str]:
    def cell(row: Mapping[str, Any]) -> str:
        value = row.get(key)
        if not isinstance(value, int | float):
            return "-"
        return format(value * scale if scale != 1.0 else value, spec)

    return cell


def _server(key: str, spec: str, scale: float = 1.0) -> Callable[[Mapping[str, Any]], str]:
    def cell(row: Mapping[str, Any]) -> str:
        return _num(key, spec, scale)(row.get("server") or {})

    return cell


def _load(row: Mapping[str, Any]) -> str:
    if row.get("name") == "overall":
        return ""
    if isinstance(row.get("target_rate"), int | float):
        return f"{row['target_rate']:g} req/s"
    return f"{row['target_users']} users" if isinstance(row.get("target_users"), int) else "-"


def _saturated(row: Mapping[str, Any]) -> str:
    """YES: the stage's queue and TTFT grew without bound; no: stable; -: not judged (overall: YES if a
    measured stage was)."""
    if row.get("name") == "overall":
        return "YES" if row.get("over_saturated_stages") else "-"
    sat = row.get("saturation")
    verdict = sat.get("verdict") if isinstance(sat, Mapping) else None
    return {"over_saturated": "YES", "stable": "no"}.get(str(verdict), "-")


def saturation_lines(stages: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per over-saturated stage: when it was found, whether it ended the run, why."""
    out = []
    for s in stages:
        sat = s.get("saturation")
        if not isinstance(sat, Mapping) or sat.get("verdict") != "over_saturated":
            continue
        at = sat.get("detected_at_s")
        when = f" (found at {at:.0f} s" if isinstance(at, int | float) else " ("
        stopped = "; ended the run" if s.get("end_reason") == "over_saturated" else ""
        out.append(f"OVER-SATURATED: {s.get('name')}{when}{stopped}): {sat.get('reason', '')}")
    return out


COLUMNS: tuple[Column, ...] = (
    ("load", 10, _load),
    ("ok", 6, _num("completed", "d")),
    ("failed", 6, _num("failed", "d")),
    ("req/s", 7, _num("request_throughput", ".2f")),
    ("out tok/s", 9, _num("output_throughput", ".1f")),
    ("TTFT p50 ms", 11, _num("p50_ttft_ms", ".1f")),
    ("TTFT p99 ms", 11, _num("p99_ttft_ms", ".1f")),
    ("ITL p50 ms", 10, _num("p50_itl_ms", ".2f")),
    ("ITL p99 ms", 10, _num("p99_itl_ms", ".2f")),
    ("E2E p99 ms", 10, _num("p99_e2el_ms", ".0f")),
    ("goodput %", 9, _num("goodput_ratio", ".1f", 100.0)),
    ("over-sat.", 9, _saturated),
)
SERVER_COLUMNS: tuple[Column, ...] = (
    ("VRAM peak GiB", 13, _server("peak_vram_gib", ".2f")),
    ("GPU util mean %", 15, _server("mean_gpu_utilization_ratio", ".0f", 100.0)),
    ("GPU util swing %", 16, _server("gpu_utilization_peak_to_trough_ratio", ".0f", 100.0)),
)
LEGEND = (
    "  ok/failed: requests that began in the stage; req/s, out tok/s: per second of the stage; TTFT, ITL (per\n"
    "  token), E2E: client-side percentiles over those requests, ms; goodput: share of ok requests meeting every\n"
    "  SLO of their class; over-sat.: queue and TTFT grew without bound (docs/loadgen.md, Over-saturation)"
)


def stage_table(doc: Mapping[str, Any]) -> str:
    """The table of a result document (a dict as written), with the server-side columns when it has them."""
    stages: Sequence[Mapping[str, Any]] = doc.get("stages") or []
    rows: list[Mapping[str, Any]] = list(stages)
    if doc.get("overall"):
        rows.append({**doc["overall"], "name": "overall"})
    columns = COLUMNS + (SERVER_COLUMNS if any(s.get("server") for s in stages) else ())
    width = max([len("stage"), *(len(_name(r)) for r in rows)])
    lines = [f"{'stage':<{width}} " + " ".join(f"{h:>{w}}" for h, w, _ in columns)]
    lines.append("-" * width + " " + " ".join("-" * w for _, w, _ in columns))
    for r in rows:
        lines.append(f"{_name(r):<{width}} " + " ".join(f"{cell(r):>{w}}" for _, w, cell in columns))
    lines.append(LEGEND + (" (server columns: Prometheus, over the stage)" if len(columns) > len(COLUMNS) else ""))
    lines.extend(saturation_lines(stages))
    lines.extend(workload_summary(doc))  # conversations and the prefix cache, when the run had them
    validity = doc.get("validity") or {}
    if validity and not validity.get("results_valid", True):
        lines.append("RESULTS INVALID: " + "; ".join(validity.get("reasons", [])))
    return "\n".join(lines)


def _name(row: Mapping[str, Any]) -> str:
    return str(row.get("name", "?")) + (" (warmup)" if row.get("warmup") else "")
