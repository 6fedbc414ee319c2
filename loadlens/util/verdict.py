"""The run's verdict, computed here and nowhere else: pass/fail against the SLO file, and the alerts and
pages of the run's window.

Two halves:

- :func:`slo_checks` and :func:`build_verdict` are pure: a parsed ``benchmark_result.json``, the SLO file and
  what was observed (alerts, pages) give a :class:`~loadlens.contracts.results.Verdict` with its one-line
  headline (``FAIL: TTFT p99 (interactive) at c16/c32 above 200 ms; 3 alerts fired; 2 pages``).
- :func:`observe` reads the alerts (Prometheus ``ALERTS``/``ALERTS_FOR_STATE`` over the window and
  ``/api/v1/rules`` for pending ones) and the pages (the pager's ``GET /pages``) of the window, after waiting,
  bounded, for alerts that were pending when the run ended and could still fire, and for the pages of alerts
  that fired.

``loadlens load`` calls both once the run has ended and writes the verdict into the result file; the demo and
the report only show it. docs/loadgen.md (*Verdict*) defines every check.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
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
from loadlens.util.prometheus import PrometheusClient, PrometheusUnreachable, QueryError

OVERALL = "overall"
DEFAULT_ALERT_WAIT_S = 180.0
"""Longest wait after the run for pending alerts and pages: above the SLO alerts' longest ``for:`` (2m)."""
PAGE_GRACE_S = 30.0
"""How long a firing alert of the window may take to reach the pager (group_wait 5-10 s, resend, delivery)."""
LATENCY_SLOS: tuple[tuple[str, str, str], ...] = (
    ("ttft", "ttft", "TTFT"),
    ("itl", "itl", "ITL"),
    ("e2e", "e2el", "E2E"),
)
"""(SLO name in the SLO file, result key infix, headline name)."""
_PERCENTILE_ATTR = {0.5: "p50", 0.9: "p90", 0.95: "p95", 0.99: "p99", 0.999: "p99_9"}
_NAMES = {"goodput": "goodput", "error_ratio": "error ratio", "lora_swap": "hot-swap delayed ratio"}
_HIDDEN_LABELS = frozenset({"__name__", "alertname", "alertstate", "severity"})


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: Any) -> float | None:
    """Unix seconds from an RFC 3339 time as Prometheus and Alertmanager write it (up to nanoseconds)."""
    if not isinstance(text, str) or not text:
        return None
    value = text.strip().replace("Z", "+00:00")
    if "." in value:  # Python parses at most 6 fractional digits; Go writes up to 9
        head, _, rest = value.partition(".")
        digits = "".join(c for c in rest if c.isdigit())
        value = f"{head}.{digits[:6]}{rest[len(digits) :]}"
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


# --- SLO checks (pure) ---------------------------------------------------------------------------------------


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


# --- alerts and pages of the window --------------------------------------------------------------------------

LabelKey = tuple[tuple[str, str], ...]


def _key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ("__name__", "alertstate")))


def _alert(labels: Mapping[str, str], state: str, starts: float | None, ends: float | None) -> VerdictAlert:
    return VerdictAlert(
        alertname=labels.get("alertname", "unknown"),
        severity=labels.get("severity"),
        state=state,  # type: ignore[arg-type]  # firing | resolved | pending
        starts_at=iso(starts) if starts is not None else None,
        ends_at=iso(ends) if ends is not None else None,
        labels={k: v for k, v in sorted(labels.items()) if k not in _HIDDEN_LABELS},
    )


def _active(groups: Sequence[Mapping[str, Any]], start: float) -> list[tuple[dict[str, str], str, float, float]]:
    """(labels, state, activeAt, for-seconds) of the rules' active alerts that became active in the window."""
    out = []
    for group in groups:
        for rule in group.get("rules", []):
            for alert in rule.get("alerts", []) or []:
                active = parse_time(alert.get("activeAt"))
                if active is None or active < start:
                    continue
                labels = {str(k): str(v) for k, v in (alert.get("labels") or {}).items()}
                out.append((labels, str(alert.get("state")), active, float(rule.get("duration") or 0.0)))
    return out


def _interval(groups: Sequence[Mapping[str, Any]]) -> float:
    return max((float(g.get("interval") or 0.0) for g in groups), default=0.0)


def alert_history(
    client: PrometheusClient, start: float, until: float, groups: Sequence[Mapping[str, Any]]
) -> list[VerdictAlert]:
    """Alerts that fired in [start, until] (``ALERTS{alertstate="firing"}``), leaving out evaluations of an
    alert that became active before ``start`` (``ALERTS_FOR_STATE`` holds its activeAt), plus those still
    pending at ``until``. ``groups`` is ``/api/v1/rules`` read at ``until``."""
    span = max(1.0, until - start)
    step = max(1, math.ceil(span / 10_000))  # Prometheus refuses more than 11,000 points per series
    firing = client.query_range('ALERTS{alertstate="firing"}', start, until, step)
    for_state = client.query_range("ALERTS_FOR_STATE", start, until, step)
    active_at: dict[LabelKey, dict[float, float]] = {}
    for series in for_state:
        active_at[_key(series.get("metric", {}))] = {round(float(t), 3): float(v) for t, v in series.get("values", [])}
    still = {_key(labels): state for labels, state, _, _ in _active(groups, start)}
    out: list[VerdictAlert] = []
    fired: set[LabelKey] = set()
    for series in firing:
        labels = {str(k): str(v) for k, v in series.get("metric", {}).items()}
        key = _key(labels)
        since = active_at.get(key, {})
        times = [
            round(float(t), 3)
            for t, _ in series.get("values", [])
            if since.get(round(float(t), 3), start) >= start  # unknown activeAt: counted
        ]
        if not times:
            continue
        fired.add(key)
        if still.get(key) == "firing":
            out.append(_alert(labels, "firing", times[0], None))
        else:
            out.append(_alert(labels, "resolved", times[0], times[-1]))
    for labels, state, active, _ in _active(groups, start):
        if state == "pending" and _key(labels) not in fired:
            out.append(_alert(labels, "pending", active, None))
    out.sort(key=lambda a: (a.starts_at or "", a.alertname, sorted(a.labels.items())))
    return out


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def fetch_notifications(source: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The notifications the pager has received: ``GET /pages`` of a pager URL (those since it started), or
    every line of its log file (``pages.jsonl``, all of them; a missing file holds none). Raises OSError or
    ValueError."""
    if not is_url(source):
        path = Path(source)
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line being written as we read
            if isinstance(entry, dict):
                out.append(entry)
        return out
    with urllib.request.urlopen(source.rstrip("/") + "/pages", timeout=timeout) as response:
        doc = json.loads(response.read())
    notifications = doc.get("notifications") if isinstance(doc, dict) else None
    if not isinstance(notifications, list):
        raise ValueError(f"{source}/pages did not answer like loadlens pager (no notifications list)")
    return [n for n in notifications if isinstance(n, dict)]


def pages_in_window(notifications: Iterable[Mapping[str, Any]], start: float, until: float) -> list[VerdictPage]:
    """Alerts of the notifications received in [start, until] whose own ``startsAt`` is in the window: a
    resolution or a repeat of an earlier run's alert is not this run's page."""
    out: list[tuple[float, VerdictPage]] = []
    for n in notifications:
        at = n.get("received_at")
        if not isinstance(at, int | float) or not start <= at <= until:
            continue
        for alert in n.get("alerts") or []:
            starts = parse_time(alert.get("startsAt"))
            if starts is None or starts < start:
                continue
            labels = alert.get("labels") or {}
            page = VerdictPage(
                alertname=str(labels.get("alertname", "unknown")),
                severity=labels.get("severity"),
                receiver=str(n.get("receiver", "")),
                status=str(alert.get("status", "")),
                at=iso(float(at)),
            )
            out.append((float(at), page))
    out.sort(key=lambda x: x[0])
    return [p for _, p in out]


def _paged(labels: Mapping[str, str], notifications: Iterable[Mapping[str, Any]], start: float) -> bool:
    for n in notifications:
        for alert in n.get("alerts") or []:
            got = alert.get("labels") or {}
            starts = parse_time(alert.get("startsAt"))
            if starts is not None and starts >= start and all(got.get(k) == v for k, v in labels.items()):
                return True
    return False


def observe(
    *,
    start: float,
    end: float,
    prometheus_url: str | None,
    pager_url: str | None,
    wait_limit: float = DEFAULT_ALERT_WAIT_S,
    timeout: float = 5.0,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = lambda _: None,
) -> Observation:
    """Wait (at most until ``end + wait_limit``) for the window's alerts to settle, then read them and the pages.

    Settled means: two rule evaluations have passed since ``end`` (the run's last samples are scraped and
    judged), no alert that became pending in the window can still fire before the bound (activeAt + for:),
    and every alert of the window that fired has reached the pager (``pager_url``: its URL, or its log file
    ``pages.jsonl``), or has had
    :data:`PAGE_GRACE_S` to do so (an alert routed nowhere never arrives). Without ``prometheus_url`` there is
    nothing to wait for and only the pages are read.
    """
    window = VerdictWindow(start=iso(start), end=iso(end), start_timestamp=start, end_timestamp=end)
    window.wait_limit_seconds = wait_limit
    obs = Observation(window=window, alerts_source=prometheus_url, pages_source=pager_url)
    client = PrometheusClient(prometheus_url, timeout=timeout) if prometheus_url else None
    deadline = end + wait_limit
    groups: list[dict[str, Any]] = []
    notifications: list[dict[str, Any]] = []
    if client is not None:
        try:
            groups = client.rule_groups()
            interval = _interval(groups)
            earliest = end + 2 * interval
            first_firing: dict[LabelKey, float] = {}
            told = False
            while True:
                t = now()
                waiting: list[str] = []
                unpaged: list[dict[str, str]] = []
                for labels, state, active, for_s in _active(groups, start):
                    if state == "pending" and active + for_s + interval <= deadline:
                        waiting.append(f"{labels.get('alertname')} (pending)")
                    elif state == "firing" and t - first_firing.setdefault(_key(labels), t) < PAGE_GRACE_S:
                        unpaged.append(labels)
                if pager_url is not None and unpaged:
                    if any(not _paged(labels, notifications, start) for labels in unpaged):
                        notifications = _notifications(pager_url, timeout, obs)  # once per poll
                    waiting += [
                        f"{labels.get('alertname')} (not paged yet)"
                        for labels in unpaged
                        if not _paged(labels, notifications, start)
                    ]
                if (t >= earliest and not waiting) or t >= deadline:
                    break
                if waiting and not told:
                    say(f"waiting up to {max(0.0, deadline - t):.0f} s for alerts to settle: {', '.join(waiting)}")
                    told = True
                sleep(max(0.05, min(1.0, deadline - t)))
                groups = client.rule_groups()
            until = now()
            obs.alerts = alert_history(client, start, until, groups)
        except (PrometheusUnreachable, QueryError) as err:
            obs.errors.append(f"alerts: Prometheus {prometheus_url}: {err}")
    until = now()
    window.checked_until = iso(until)
    window.waited_seconds = round(max(0.0, until - max(end, start)), 3)
    if pager_url is not None:
        notifications = _notifications(pager_url, timeout, obs)
        obs.pages = pages_in_window(notifications, start, until)
    return obs


def _notifications(pager_url: str, timeout: float, obs: Observation) -> list[dict[str, Any]]:
    try:
        return fetch_notifications(pager_url, timeout)
    except (OSError, ValueError) as err:  # URLError, HTTPError, a timeout, not JSON
        message = f"pages: pager {pager_url}: {getattr(err, 'reason', err)}"
        if message not in obs.errors:
            obs.errors.append(message)
        return []


# --- console -------------------------------------------------------------------------------------------------


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    return f"{x:.1f} ms" if unit == "ms" else f"{x * 100:.2f} %"


def verdict_text(verdict: Verdict) -> str:
    """The verdict for the console: the headline, failed checks, alerts and pages of the window."""
    lines = [f"verdict: {verdict.headline}"]
    failed = [c for c in verdict.slos if c.passed is False]
    judged = sum(1 for c in verdict.slos if c.passed is not None)
    stages = ", ".join(f"{name} {status.upper()}" for name, status in verdict.stages.items())
    lines.append(f"  stages: {stages}")
    lines.append(f"  SLO checks: {judged - len(failed)} of {judged} passed" + (", failed:" if failed else ""))
    for c in failed:
        cls = c.priority_class or "all"
        lines.append(
            f"    {c.stage:<14} {cls:<12} {c.slo:<11} {c.statistic:<5} {_fmt(c.observed, c.unit):>11} "
            f"(SLO {c.comparison} {_fmt(c.threshold, c.unit)})"
        )
    w = verdict.window
    if verdict.alerts_source is None:
        lines.append("  alerts: not checked (no --prometheus)")
    else:
        waited = f"waited {w.waited_seconds or 0:.0f} s of at most {w.wait_limit_seconds or 0:.0f} s"
        lines.append(f"  alerts of the run {w.start} .. {w.end} (checked until {w.checked_until}, {waited}):")
        if not verdict.alerts:
            lines[-1] += " none"
        for a in verdict.alerts:
            # sloth_* labels name the burn-rate rule's origin; the file keeps them, the console leaves them out
            labels = " ".join(f"{k}={v}" for k, v in a.labels.items() if not k.startswith("sloth_"))
            until = f" until {a.ends_at}" if a.ends_at else ""
            lines.append(
                f"    {a.severity or '-':<8} {a.alertname:<34} {a.state:<8} since {a.starts_at}{until}  {labels}"
            )
    if verdict.pages_source is None:
        lines.append("  pages: not checked (no --pager)")
    else:
        lines.append(f"  pages the pager received for alerts of the run: {len(verdict.pages) or 'none'}")
        for p in verdict.pages:
            lines.append(f"    {p.at} {p.receiver:<7} {p.status:<8} {p.severity or '-':<8} {p.alertname}")
    for e in verdict.errors:
        lines.append(f"  error: {e}")
    return "\n".join(lines)
