"""A small typed builder for Grafana dashboard JSON (schemaVersion 42).

Only what loadlens needs: time series, stat and state-timeline panels with Prometheus targets, query
variables, a datasource variable and Prometheus annotations. Every panel and target points at the
``${datasource}`` variable, so one provisioned (or user-picked) Prometheus serves every dashboard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA_VERSION = 42
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
RATE_INTERVAL = "$__rate_interval"

PanelKind = Literal["timeseries", "stat", "state-timeline"]


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str
    instant: bool = False


@dataclass(frozen=True)
class Threshold:
    """A constant line drawn on a time series panel: ``base`` below ``value``, ``color`` from it up.

    A lower bound (e.g. a minimum correlation) swaps them: ``Threshold(v, color="green", base="red")``.
    """

    value: float
    color: str = "red"
    base: str = "green"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[Target, ...]
    description: str = ""
    kind: PanelKind = "timeseries"
    threshold: Threshold | None = None
    stack: bool = False
    min: float | None = None
    max: float | None = None
    width: int = 12
    height: int = 8
    # Series whose display name matches this regex are drawn dashed (SLO lines).
    dashed: str | None = None


@dataclass(frozen=True)
class Variable:
    """A Prometheus query variable: ``label_values(<metric selector>, <label>)``."""

    name: str
    label: str
    query: str
    multi: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "type": "query",
            "datasource": DATASOURCE,
            "definition": self.query,
            "query": {"qryType": 1, "query": self.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2,
            "sort": 1,
            "multi": self.multi,
            "includeAll": True,
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "options": [],
            "hide": 0,
            "regex": "",
        }


@dataclass(frozen=True)
class Annotation:
    name: str
    expr: str
    title: str
    color: str
    text: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "datasource": DATASOURCE,
            "enable": True,
            "hide": False,
            "iconColor": self.color,
            "expr": self.expr,
            "step": "5s",
            "titleFormat": self.title,
            "textFormat": self.text,
            "tagKeys": "",
            "useValueForTime": False,
        }


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[Variable, ...] = ()
    annotations: tuple[Annotation, ...] = ()
    tags: tuple[str, ...] = ("loadlens",)
    refresh: str = "10s"
    time_from: str = "now-30m"
    links: tuple[str, ...] = field(default=())

    def panels(self) -> list[Panel]:
        return [p for row in self.rows for p in row.panels]

    def to_json(self) -> dict[str, Any]:
        panels: list[dict[str, Any]] = []
        next_id = 1
        y = 0
        for row in self.rows:
            panels.append(
                {
                    "id": next_id,
                    "type": "row",
                    "title": row.title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                    "panels": [],
                }
            )
            next_id += 1
            y += 1
            x = 0
            row_height = 0
            for panel in row.panels:
                if x + panel.width > 24:
                    x = 0
                    y += row_height
                    row_height = 0
                panels.append(_panel_json(panel, next_id, x, y))
                next_id += 1
                x += panel.width
                row_height = max(row_height, panel.height)
            y += row_height
        datasource_var: dict[str, Any] = {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {"selected": False, "text": "Prometheus", "value": "prometheus"},
            "hide": 0,
            "includeAll": False,
            "multi": False,
            "options": [],
            "refresh": 1,
            "regex": "",
        }
        builtin: dict[str, Any] = {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": list(self.tags),
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "editable": False,
            "graphTooltip": 1,
            "timezone": "browser",
            "refresh": self.refresh,
            "time": {"from": self.time_from, "to": "now"},
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "links": [],
            "annotations": {"list": [builtin, *(a.to_json() for a in self.annotations)]},
            "templating": {"list": [datasource_var, *(v.to_json() for v in self.variables)]},
            "panels": panels,
        }


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": panel.threshold.base if panel.threshold else "green", "value": None}]
    if panel.threshold is not None:
        steps.append({"color": panel.threshold.color, "value": panel.threshold.value})
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "thresholds": {"mode": "absolute", "steps": steps},
        "color": {"mode": "palette-classic"},
    }
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    overrides: list[dict[str, Any]] = []
    options: dict[str, Any]
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if panel.stack else 0,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
            "thresholdsStyle": {"mode": "line" if panel.threshold is not None else "off"},
        }
        options = {
            "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True, "calcs": ["mean", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
        if panel.dashed is not None:
            overrides.append(
                {
                    "matcher": {"id": "byRegexp", "options": panel.dashed},
                    "properties": [
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                        {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
                    ],
                }
            )
    elif panel.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        }
    else:
        options = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "showValue": "never",
            "mergeValues": True,
            "rowHeight": 0.9,
        }
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": options,
        "targets": [
            {
                "datasource": DATASOURCE,
                "refId": chr(ord("A") + i),
                "expr": t.expr,
                "legendFormat": t.legend,
                "range": not t.instant,
                "instant": t.instant,
                "editorMode": "code",
            }
            for i, t in enumerate(panel.targets)
        ],
    }


# --- PromQL helpers -------------------------------------------------------------------------------------

_COUNTER_SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def rate(metric: str, selector: str) -> str:
    return f"rate({metric}{{{selector}}}[{RATE_INTERVAL}])"


def increase(metric: str, selector: str) -> str:
    return f"increase({metric}{{{selector}}}[{RATE_INTERVAL}])"


def quantile(q: float, histogram: str, selector: str, by: str = "") -> str:
    """``histogram_quantile`` of a classic histogram over ``$__rate_interval``."""
    labels = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({labels}) ({rate(histogram + '_bucket', selector)}))"


def mean(histogram: str, selector: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return (
        f"sum{grouping} ({rate(histogram + '_sum', selector)}) / sum{grouping} ({rate(histogram + '_count', selector)})"
    )


def counter_metrics(expr: str) -> list[str]:
    """Names in ``expr`` that are counters or histogram series (by their suffix); they need rate()/increase()."""
    names = []
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{|\[)", expr):
        name = m.group(1)
        if name.endswith(_COUNTER_SUFFIXES):
            names.append(name)
    return names


def unrated_counters(expr: str) -> list[str]:
    """Counter names in ``expr`` that are not the argument of rate()/increase() over ``$__rate_interval``."""
    rated = re.findall(
        r"\b(?:rate|increase)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{[^}]*\})?\s*\[\$__rate_interval\]\s*\)", expr
    )
    remaining = list(rated)
    missing = []
    for name in counter_metrics(expr):
        if name in remaining:
            remaining.remove(name)
        else:
            missing.append(name)
    return missing
