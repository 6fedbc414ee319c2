"""Shared by the dashboard tests: every query of every dashboard, and Grafana's variable substitution."""

from __future__ import annotations

from collections.abc import Mapping

from loadlens.dashboards.model import Dashboard

MODEL = "tiny"
# What Grafana substitutes: $__rate_interval is max(4 × scrape interval, interval + scrape interval); the
# test Prometheus scrapes every second, so 15 s spans many samples. Multi-value "All" becomes `.*`.
VARIABLES = {
    "$__rate_interval": "15s",
    "$model": MODEL,
    "$instance": ".*",
    "$gpu": ".*",
    "$stage": ".*",
    "$run": ".*",
}


def concrete(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def all_queries(boards: Mapping[str, Dashboard]) -> list[tuple[str, str]]:
    """(where, expr) for every panel target and every Prometheus annotation."""
    out = []
    for stem, board in boards.items():
        for panel in board.panels():
            for target in panel.targets:
                out.append((f"{stem} / {panel.title} / {target.legend}", target.expr))
        for ann in board.annotations:
            out.append((f"{stem} / annotation {ann.name}", ann.expr))
    return out
