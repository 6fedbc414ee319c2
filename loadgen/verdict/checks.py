"""A run's verdict from its result and the SLO file: pure (no I/O; what was observed is an argument).

:func:`slo_checks` judges every SLO of the SLO file on every measured stage and ``overall``;
:func:`build_verdict` adds the alerts and pages the observer saw (``loadgen/verdict/observer.py``, an
:class:`Observation`) and writes the one-line headline
(``FAIL: TTFT p99 (interactive) at c16/c32 above 200 ms; 3 alerts fired; 2 pages``). docs/loadgen.md
(*Verdict*) defines every check.

Usage::

    verdict = build_verdict(parse_result(doc), load_slos(), observation)   # observation None: not observed
    verdict.status, verdict.headline
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from loadlens.contracts.results import (
    BenchmarkResult,
    Figures,
    SliceFigures,
    SLOCheck,
    Verdict,
    VerdictAlert,
    VerdictPage,
    VerdictWindow,
)
from loadlens.contracts.slo import SLOConfig

OVERALL = "overall"
LATENCY_SLOS: tuple[tuple[str, str, str], ...] = (
    ("ttft", "ttft", "TTFT"),
    ("itl", "itl", "ITL"),
    ("e2e", "e2el", "E2E"),
)
"""(SLO name in the SLO file, result key infix, headline name)."""
_PERCENTILE_ATTR = {0.5: "p50", 0.9: "p90", 0.95: "p95", 0.99: "p99", 0.999: "p99_9"}
_NAMES = {"goodput": "goodput", "error_ratio": "error ratio", "lora_swap": "hot-swap delayed ratio"}


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _check(
    slo: str,
    cls: str | None,
    stage: str,
    statistic: str,
    comparison: str,
    threshold: float,
    observed: float | None,
    unit: str,
) -> SLOCheck:
    passed: bool | None = None
    if observed is not None:
        passed = observed <= threshold if comparison == "<=" else observed >= threshold
    return SLOCheck(
        slo=slo,
        priority_class=cls,
        stage=stage,
        statistic=statistic,
        comparison="<=" if comparison == "<=" else ">=",
        threshold=threshold,
        observed=observed,
        unit=unit,
        passed=passed,
    )


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return round(num / den, 6)


def _swap_counts(result: BenchmarkResult, stage: str) -> tuple[float, float, float] | None:
    """(blocked, delayed, eligible) of a stage, or summed over the measured stages for ``overall``."""
    names = [s.name for s in result.stages if not s.warmup] if stage == OVERALL else [stage]
    blocked = delayed = eligible = 0.0
    seen = False
    for s in result.stages:
        server = s.server
        if s.name not in names or server is None:
            continue
        if server.lora_swap_blocked_requests is None or server.slo_eligible_requests is None:
            continue
        seen = True
        blocked += server.lora_swap_blocked_requests
        delayed += server.lora_swap_delayed_requests or 0.0
        eligible += server.slo_eligible_requests
    return (blocked, delayed, eligible) if seen else None


def slo_checks(result: BenchmarkResult, slos: SLOConfig) -> list[SLOCheck]:
    """Every SLO of the SLO file on every measured stage and ``overall``: per class TTFT, ITL and E2E at the
    class objective's percentile and goodput; per stage the error ratio, and the hot-swap SLA where adapter
    swaps blocked requests (server-side counts from ``--prometheus``)."""
    traffic = {t.priority_class for t in result.profile.traffic} if result.profile else set()
    if not traffic:  # no profile block: the classes that show up in the stages
        traffic = {c for s in result.stages for c in s.classes}
    classes = [c for c in slos.classes if c.name in traffic]
    slices: list[tuple[str, SliceFigures]] = [(s.name, s) for s in result.stages if not s.warmup]
    if result.overall is not None:
        slices.append((OVERALL, result.overall))
    goodput_min = slos.alerting.get("goodput_ratio_min")
    error_max = round(1.0 - slos.availability_objective_ratio, 9)
    checks: list[SLOCheck] = []
    for name, sl in slices:
        for cls in classes:
            fig: Figures | None = sl.classes.get(cls.name)
            attr = _PERCENTILE_ATTR.get(round(cls.objective_ratio, 6))
            statistic = f"p{cls.objective_ratio * 100:g}"
            thresholds = cls.thresholds()
            for slo, infix, _ in LATENCY_SLOS:
                observed = getattr(fig, f"{attr}_{infix}_ms") if fig is not None and attr else None
                threshold = round(thresholds[slo] * 1000.0, 6)
                checks.append(_check(slo, cls.name, name, statistic, "<=", threshold, observed, "ms"))
            if goodput_min is not None:
                observed = fig.goodput_ratio if fig is not None else None
                checks.append(_check("goodput", cls.name, name, "ratio", ">=", float(goodput_min), observed, "ratio"))
        finished = (sl.completed or 0) + (sl.failed or 0)
        observed = _ratio(sl.failed, finished) if sl.failed is not None else None
        checks.append(_check("error_ratio", None, name, "ratio", "<=", error_max, observed, "ratio"))
        counts = _swap_counts(result, name)
        if counts is not None and counts[0] > 0:
            observed = _ratio(counts[1], counts[2])
            threshold = slos.lora_swap.max_delayed_ratio
            checks.append(_check("lora_swap", None, name, "ratio", "<=", threshold, observed, "ratio"))
    return checks


def stage_status(checks: Sequence[SLOCheck]) -> dict[str, Any]:
    """Each stage's (and overall's) status, in order: fail if a check failed, pass if every judged one passed."""
    out: dict[str, Any] = {}
    for c in checks:
        was = out.setdefault(c.stage, "unknown")
        if c.passed is False:
            out[c.stage] = "fail"
        elif c.passed is True and was == "unknown":
            out[c.stage] = "pass"
    return out


def _value(x: float, unit: str) -> str:
    return f"{x:g} ms" if unit == "ms" else f"{x * 100:g} %"


def _failures(checks: Sequence[SLOCheck]) -> list[str]:
    """One phrase per failed SLO (and class), naming the stages: 'TTFT p99 (interactive) at c16/c32 above 200 ms'."""
    judged_classes = {c.priority_class for c in checks if c.passed is not None and c.priority_class}
    groups: dict[tuple[str, str | None, str, str, float, str], list[str]] = {}
    for c in checks:
        if c.passed is False:
            groups.setdefault((c.slo, c.priority_class, c.statistic, c.comparison, c.threshold, c.unit), []).append(
                c.stage
            )
    phrases = []
    for (slo, cls, statistic, comparison, threshold, unit), stages in groups.items():
        where = [s for s in stages if s != OVERALL] or stages
        latency = {n: h for n, _, h in LATENCY_SLOS}
        what = f"{latency[slo]} {statistic}" if slo in latency else _NAMES.get(slo, slo)
        if cls and len(judged_classes) > 1:
            what += f" ({cls})"
        side = "above" if comparison == "<=" else "below"
        phrases.append(f"{what} at {'/'.join(where)} {side} {_value(threshold, unit)}")
    return phrases


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _pages_phrase(pages: Sequence[VerdictPage]) -> str:
    """'no pages', '2 pages', or '3 pages (2 pager, 1 ticket)' when they went to several receivers."""
    by_receiver: dict[str, int] = {}
    for p in pages:
        if p.status == "firing":
            by_receiver[p.receiver] = by_receiver.get(p.receiver, 0) + 1
    total = sum(by_receiver.values())
    if not total:
        return "no pages"
    if len(by_receiver) == 1:
        return _plural(total, "page")
    return f"{_plural(total, 'page')} ({', '.join(f'{n} {r}' for r, n in by_receiver.items())})"


@dataclass
class Observation:
    """What :func:`observe` saw in the window: alerts, pages, where from, how long it waited."""

    window: VerdictWindow
    alerts: list[VerdictAlert] = field(default_factory=list)
    pages: list[VerdictPage] = field(default_factory=list)
    alerts_source: str | None = None
    pages_source: str | None = None
    errors: list[str] = field(default_factory=list)


def run_window(result: BenchmarkResult) -> VerdictWindow:
    start, end = result.run.start_timestamp, result.run.end_timestamp
    return VerdictWindow(
        start=result.run.start_time or (iso(start) if start is not None else None),
        end=result.run.end_time or (iso(end) if end is not None else None),
        start_timestamp=start,
        end_timestamp=end,
    )


def build_verdict(result: BenchmarkResult, slos: SLOConfig, observation: Observation | None = None) -> Verdict:
    """The verdict of a result: its SLO checks, and the alerts and pages observed in its window."""
    obs = observation or Observation(window=run_window(result))
    checks = slo_checks(result, slos)
    judged = [c for c in checks if c.passed is not None]
    failures = _failures(checks)
    if failures:
        status, body = "fail", "; ".join(failures)
    elif judged:
        stages = len({c.stage for c in judged if c.stage != OVERALL})
        status = "pass"
        body = f"{_plural(len(judged), 'SLO check')} passed over {_plural(stages, 'stage')} and overall"
    else:
        status, body = "unknown", "no SLO could be judged (no completed requests)"
    tail: list[str] = []
    if obs.alerts_source is not None:
        fired = sum(1 for a in obs.alerts if a.state != "pending")
        pending = len(obs.alerts) - fired
        tail.append(_plural(fired, "alert") + " fired" if fired else "no alerts fired")
        if pending:
            tail[-1] += f", {pending} still pending"
    else:
        tail.append("alerts not checked")
    if obs.pages_source is not None:
        tail.append(_pages_phrase(obs.pages))
    if obs.errors:
        tail.append(f"{_plural(len(obs.errors), 'error')} reading alerts or pages")
    if result.validity is not None and not result.validity.results_valid:
        tail.append("results invalid (load generator CPU-bound)")
    headline = f"{status.upper()}: {body}; {'; '.join(tail)}"
    return Verdict(
        status=status,  # type: ignore[arg-type]  # one of the three literals above
        headline=headline,
        slos=checks,
        stages=stage_status(checks),
        alerts=obs.alerts,
        pages=obs.pages,
        window=obs.window,
        alerts_source=obs.alerts_source,
        pages_source=obs.pages_source,
        errors=obs.errors,
    )
