"""What the report asks Prometheus: the dashboards' own panel queries, made concrete for one test window.

Pure helpers (time parsing, variable substitution, legends, stage bands) and :func:`collect`, which asks
through the one Prometheus client (``loadlens.util.prometheus``). Grafana's ``$__rate_interval`` becomes a
fixed window (default ``30s``) and every multi-value template variable becomes ``.*`` (Grafana's "All").
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from loadlens.contracts.slo import SLOConfig
from loadlens.dashboards.model import RATE_INTERVAL, Dashboard, Panel
from loadlens.util.prometheus import PrometheusClient, QueryError

TEMPLATE_VARIABLES = ("$model", "$instance", "$gpu", "$stage", "$run")
MAX_POINTS = 400
_DURATION = re.compile(r"^[1-9][0-9]*(ms|s|m|h)$")
_SLO_NAME = re.compile(r'slo="([a-z0-9_]+)"')
_LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def parse_time(text: str) -> float:
    """Unix seconds (``1795995431`` or ``1795995431.5``) or ISO 8601 (``2026-11-29T23:37:11Z``) -> Unix seconds.

    ISO times without an offset are UTC. Raises ``ValueError`` naming the value.
    """
    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        pass
    else:
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"not a time: {text!r} (Unix seconds must be positive)")
        return value
    iso = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    try:
        parsed = datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use Unix seconds or ISO 8601, e.g. 2026-11-29T23:37:11Z)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_duration(text: str) -> str:
    """A Prometheus range like ``30s`` or ``1m`` (validated, returned as is)."""
    if not _DURATION.match(text.strip()):
        raise ValueError(f"not a Prometheus duration like 30s or 1m: {text!r}")
    return text.strip()


def concrete(expr: str, rate_interval: str = "30s") -> str:
    """A dashboard expression with ``$__rate_interval`` and the template variables substituted."""
    out = expr.replace(RATE_INTERVAL, rate_interval)
    for name in TEMPLATE_VARIABLES:
        out = out.replace(name, ".*")
    return out


def step_for(start: float, end: float, max_points: int = MAX_POINTS) -> int:
    """Whole seconds between points so the window has at most ``max_points`` (>= 1 s)."""
    return max(1, math.ceil((end - start) / max_points))


def legend(template: str, labels: Mapping[str, str]) -> str:
    """Grafana's legendFormat: ``{{label}}`` replaced by the series' label (empty when absent)."""
    text = _LEGEND_LABEL.sub(lambda m: labels.get(m.group(1), ""), template)
    return " ".join(text.split()) or "value"


def is_slo_target(legend_template: str) -> bool:
    """SLO reference series (dashed lines); the report draws them from the SLO file instead."""
    return legend_template.startswith("SLO")


@dataclass(frozen=True)
class RefLine:
    """A horizontal reference line in the panel's own unit (seconds, ratio...)."""

    value: float
    label: str


def slo_lines(name: str, slos: SLOConfig) -> list[RefLine]:
    """The lines of one SLO of the SLO file: ``ttft``, ``itl``, ``e2e`` (one per priority class) or
    ``lora_swap_delay``; none for another name."""
    if name in ("ttft", "itl", "e2e"):
        return [RefLine(cls.thresholds()[name], f"SLO {name.upper()} {cls.name}") for cls in slos.classes]
    if name == "lora_swap_delay":
        return [RefLine(slos.lora_swap.delay_seconds, "SLO swap delay")]
    return []


def reference_lines(panel: Panel, slos: SLOConfig, extra_slo: str | None = None) -> list[RefLine]:
    """SLO lines (one per priority class) for panels with an SLO target or given ``extra_slo``, and the
    panel's threshold line."""
    lines: list[RefLine] = []
    for target in panel.targets:
        if not is_slo_target(target.legend):
            continue
        match = _SLO_NAME.search(target.expr)
        lines.extend(slo_lines(match.group(1) if match else "", slos))
    if extra_slo is not None and not lines:
        lines.extend(slo_lines(extra_slo, slos))
    if panel.threshold is not None:
        lines.append(RefLine(panel.threshold.value, "threshold"))
    return lines


@dataclass(frozen=True)
class Series:
    name: str
    times: tuple[float, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class Stage:
    name: str
    start: float
    end: float
    warmup: bool = False


@dataclass
class PanelData:
    """One panel's series over the window, and the queries that failed (shown under the chart)."""

    dashboard: str
    row: str
    panel: Panel
    series: list[Series] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def to_series(result: Sequence[Mapping[str, Any]], legend_template: str) -> list[Series]:
    """A ``query_range`` matrix -> named series (NaN and ±Inf points dropped; empty series skipped)."""
    out: list[Series] = []
    for item in result:
        labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
        points = [(float(t), float(v)) for t, v in item.get("values", [])]
        points = [(t, v) for t, v in points if math.isfinite(v)]
        if points:
            name = legend(legend_template, labels)
            out.append(Series(name, tuple(t for t, _ in points), tuple(v for _, v in points)))
    return out


def stages_from_series(series: Iterable[Series]) -> list[Stage]:
    """Stage bands from the Stage panel (``loadlens_loadgen_stage`` is 1 while its stage runs)."""
    stages: list[Stage] = []
    for s in series:
        run_start: float | None = None
        last = 0.0
        for t, v in zip(s.times, s.values, strict=True):
            if v >= 1 and run_start is None:
                run_start = t
            elif v < 1 and run_start is not None:
                stages.append(Stage(s.name, run_start, t))
                run_start = None
            last = t
        if run_start is not None:
            stages.append(Stage(s.name, run_start, last))
    return sorted(stages, key=lambda st: st.start)


def collect(
    client: PrometheusClient,
    boards: Mapping[str, Dashboard],
    start: float,
    end: float,
    rate_interval: str = "30s",
) -> tuple[list[PanelData], list[Stage]]:
    """Every time-series panel's data (SLO targets left out: drawn from the SLO file), and stage bands
    derived from the overview's Stage panel. Unreachable Prometheus propagates; a refused query is noted."""
    step = step_for(start, end)
    panels: list[PanelData] = []
    stage_bands: list[Stage] = []
    for stem, board in boards.items():
        for row in board.rows:
            for panel in row.panels:
                if panel.kind == "stat":
                    continue
                data = PanelData(board.title, row.title, panel)
                for target in panel.targets:
                    if is_slo_target(target.legend):
                        continue
                    try:
                        result = client.query_range(concrete(target.expr, rate_interval), start, end, step)
                    except QueryError as err:
                        data.errors.append(f"{target.legend}: {err}")
                        continue
                    data.series.extend(to_series(result, target.legend))
                if stem == "loadlens-overview" and panel.title == "Stage":
                    stage_bands = stages_from_series(data.series)
                    continue
                panels.append(data)
    return panels, stage_bands


# --- Alerts that fired ---------------------------------------------------------------------------------------

ALERTS_QUERY = 'ALERTS{alertstate="firing"}'
# Labels every ALERTS series has; the rest (job, priority_class, slo...) tell firings of one rule apart.
_ALERT_META = ("__name__", "alertname", "alertstate", "severity")


@dataclass(frozen=True)
class FiredAlert:
    """One firing interval of one alert series, clipped to the window.

    ``open_start``: already firing when the window began; ``open_end``: still firing when it ended.
    """

    name: str
    severity: str
    labels: tuple[tuple[str, str], ...]
    start: float
    end: float
    open_start: bool = False
    open_end: bool = False

    @property
    def duration(self) -> float:
        return self.end - self.start


def alert_intervals(result: Sequence[Mapping[str, Any]], start: float, end: float, step: int) -> list[FiredAlert]:
    """Firing intervals from a ``query_range`` of ``ALERTS{alertstate="firing"}`` at ``step`` seconds.

    ALERTS only exists while an alert fires, so consecutive points (gaps of at most 1.5 steps) are one
    interval. It ends one step after its last point (the alert resolved between that evaluation and the
    next), clipped to the window; an interval whose last point is within a step of the window's end is open.
    Sorted by start, then name.
    """
    out: list[FiredAlert] = []
    for item in result:
        labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
        times = sorted(float(t) for t, v in item.get("values", []) if math.isfinite(float(v)))
        if not times:
            continue
        extra = tuple(sorted((k, v) for k, v in labels.items() if k not in _ALERT_META))
        name, severity = labels.get("alertname", "?"), labels.get("severity", "")
        runs: list[tuple[float, float]] = []
        first = last = times[0]
        for t in times[1:]:
            if t - last > 1.5 * step:
                runs.append((first, last))
                first = t
            last = t
        runs.append((first, last))
        for lo, hi in runs:
            open_end = hi + step > end
            out.append(
                FiredAlert(
                    name,
                    severity,
                    extra,
                    start=max(lo, start),
                    end=end if open_end else hi + step,
                    open_start=lo - start < step / 2,
                    open_end=open_end,
                )
            )
    return sorted(out, key=lambda a: (a.start, a.name, a.labels))


def collect_alerts(client: PrometheusClient, start: float, end: float) -> list[FiredAlert]:
    """The alerts that fired in the window (a refused query propagates as :class:`QueryError`)."""
    step = step_for(start, end)
    return alert_intervals(client.query_range(ALERTS_QUERY, start, end, step), start, end, step)
