"""A run's figures: read from its ``benchmark_result.json`` (``extract_figures``), the measured stages' time
windows (``measured_windows``, for the /metrics samples) and a trial's figures over its repeats (``aggregate``).
docs/experiments.md, *Figures*, says what each key means."""

from __future__ import annotations

import math
import statistics
from typing import Any

from loadlens.contracts.experiment_result import Stat, TrialRun
from loadlens.experiment.swap_series import swap_values

# The /metrics sampler's figures a trial aggregates as sampled.KEY.
SAMPLED_FIGURES = (
    "mean_running", "peak_running", "mean_waiting", "peak_waiting", "mean_kv_cache_usage", "peak_kv_cache_usage",
    "preemptions",
)  # fmt: skip


def extract_figures(doc: dict[str, Any]) -> dict[str, float | None]:
    """A run's figures by key: ``overall``'s numbers, ``CLASS.KEY`` per class, derived ratios and
    ``server.KEY`` (with --prometheus: peaks are the maximum over measured stages, the rest their mean)."""
    out: dict[str, float | None] = {}
    overall = doc.get("overall", {})
    for key, value in overall.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
        elif value is None and key not in ("classes", "models", "stages"):
            out[key] = None
    for cls, figs in (overall.get("classes") or {}).items():
        for key, value in figs.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[f"{cls}.{key}"] = float(value)
    for model, figs in (overall.get("models") or {}).items():
        for key, value in figs.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[f"models.{model}.{key}"] = float(value)
    done, failed = out.get("completed") or 0.0, out.get("failed") or 0.0
    outcomes = overall.get("outcomes") or {}
    attempts = done + failed
    out["error_ratio"] = failed / attempts if attempts else None
    out["rate_limited_ratio"] = outcomes.get("rate_limited", 0) / attempts if attempts else None
    out["server_error_ratio"] = outcomes.get("server_error", 0) / attempts if attempts else None
    measured = [s for s in doc.get("stages", []) if not s.get("warmup") and isinstance(s.get("server"), dict)]
    keys = {k for s in measured for k, v in s["server"].items() if isinstance(v, int | float)}
    for key in sorted(keys):
        values = [float(s["server"][key]) for s in measured if isinstance(s["server"].get(key), int | float)]
        out[f"server.{key}"] = max(values) if key.startswith("peak") or "_peak_" in key else sum(values) / len(values)
    return out


def measured_windows(doc: dict[str, Any]) -> list[tuple[float, float]]:
    return [
        (float(s["start_timestamp"]), float(s["end_timestamp"]))
        for s in doc.get("stages", [])
        if not s.get("warmup") and s.get("start_timestamp") is not None and s.get("end_timestamp") is not None
    ]


def aggregate(runs: list[TrialRun]) -> dict[str, Stat]:
    """Each figure over the completed runs of a trial (sample std over ≥ 2 values)."""
    good = [r for r in runs if r.error is None]
    merged: list[dict[str, float | None]] = []
    for r in good:
        figs = dict(r.figures)
        for key in SAMPLED_FIGURES:
            figs[f"sampled.{key}"] = getattr(r.server, key)
        figs.update(swap_values(r.server.lora_swap))
        merged.append(figs)
    keys = sorted({k for f in merged for k in f})
    stats: dict[str, Stat] = {}
    for key in keys:
        values = [f.get(key) for f in merged]
        nums = [v for v in values if v is not None and math.isfinite(v)]
        stats[key] = Stat(
            mean=statistics.fmean(nums) if nums else None,
            std=statistics.stdev(nums) if len(nums) >= 2 else None,
            min=min(nums) if nums else None,
            max=max(nums) if nums else None,
            n=len(nums),
            values=values,
        )
    return stats
