"""What every rule group shares: the burn-rate and SLI windows, the selector context, the ``le`` spelling,
one alert's shape, and the runbook links added to all alerts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client.utils import floatToGoString

from loadlens.contracts.ports import SERVE_JOB
from loadlens.contracts.slo import SLOConfig

# Multi-window multi-burn-rate table for a 30-day budget (SRE Workbook; the 1d/2h row as sloth/k8s-mixin).
BURN_WINDOWS: tuple[tuple[str, str, str, float, str], ...] = (
    # severity, long, short, factor, for
    ("critical", "1h", "5m", 14.4, "2m"),
    ("critical", "6h", "30m", 6.0, "15m"),
    ("warning", "1d", "2h", 3.0, "1h"),
    ("warning", "3d", "6h", 1.0, "3h"),
)
SLI_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
SERVICE = SERVE_JOB  # sloth_service: the service whose SLOs these are


@dataclass(frozen=True)
class Ctx:
    slos: SLOConfig
    a: dict[str, Any]

    def sel(self, name: str, extra: str = "") -> str:
        base = self.a["selectors"][name]
        return "{" + ",".join(x for x in (base, extra) if x) + "}"


def le(value: float) -> str:
    """The ``le`` label value prometheus_client writes for a boundary (e.g. 0.2 -> "0.2", 20 -> "20.0")."""
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def alert(
    name: str, expr: str, for_: str, severity: str, summary: str, description: str, **labels: str
) -> dict[str, Any]:
    assert summary.endswith("."), name
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, **labels},
        "annotations": {"summary": summary, "description": description},
    }


def add_runbook_links(groups: list[dict[str, Any]], base: str) -> list[dict[str, Any]]:
    for group in groups:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["annotations"]["runbook_url"] = f"{base}#{rule['alert'].lower()}"
    return groups
