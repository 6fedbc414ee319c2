"""What every rule group shares: the burn-rate and SLI windows, the selector context, the engine series in
every dialect, the ``le`` spelling, one alert's shape, and the runbook links added to all alerts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client.utils import floatToGoString

from loadlens.contracts.engine_series import BY_VLLM
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

    def engine(self, vllm: str, form: Callable[[str], str], selector: str = "serving") -> str:
        """``form`` of one engine fact in every dialect: ``form(vLLM's series) or form(sglang's counterpart)``.

        ``form`` gets a series selector (name and matchers) and returns an instant-vector expression; the
        counterpart comes from loadlens/contracts/engine_series.py (the one mapping), with its matchers, and
        its constant labels added so both dialects' series have the vLLM shape. Without a counterpart only
        vLLM's form is returned. Wrap the result in an aggregation, whose parentheses bind the ``or`` (``>``
        binds tighter): the union then sums or maxes across dialects as across replicas, so a model served by
        a vLLM and an sglang replica counts both. Their label sets never coincide (vLLM's series carry
        ``engine``, sglang's ``engine_type``), so ``or`` drops neither.
        """
        entry = BY_VLLM[vllm]
        parts = [form(vllm + self.sel(selector, entry.vllm_matchers))]
        if entry.sglang is not None:
            other = form(entry.sglang.name + self.sel(selector, entry.sglang.matchers))
            for key, value in entry.sglang.labels:
                other = f'label_replace({other}, "{key}", "{value}", "", "")'
            parts.append(other)
        return " or ".join(parts)


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
