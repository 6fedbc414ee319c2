"""The alerts and pages of a run's window, read after the run: Prometheus (``ALERTS``, ``ALERTS_FOR_STATE``
over the window and ``/api/v1/rules`` for pending ones) and the pager (its ``GET /pages``, or its log file).

:func:`observe` first waits, bounded, for alerts that were pending when the run ended and could still fire,
and for the pages of alerts that fired (docs/loadgen.md, *Waiting for alerts*); what it saw is an
:class:`~loadgen.verdict.checks.Observation` for :func:`~loadgen.verdict.checks.build_verdict`.

Usage::

    obs = observe(start=t0, end=t1, prometheus_url="http://127.0.0.1:9090", pager_url=None, say=print)
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadgen.verdict.checks import Observation, iso
from loadlens.contracts.results import VerdictAlert, VerdictPage, VerdictWindow
from loadlens.util.prometheus import PrometheusClient, PrometheusUnreachable, QueryError

DEFAULT_ALERT_WAIT_S = 180.0
"""Longest wait after the run for pending alerts and pages: above the SLO alerts' longest ``for:`` (2m)."""
PAGE_GRACE_S = 30.0
"""How long a firing alert of the window may take to reach the pager (group_wait 5-10 s, resend, delivery)."""
_HIDDEN_LABELS = frozenset({"__name__", "alertname", "alertstate", "severity"})


def parse_time(text: Any) -> float | None:
    """Unix seconds from an RFC 3339 time as Prometheus and Alertmanager write it (up to nanoseconds); a time
    without an offset is UTC, never the machine's local time."""
    if not isinstance(text, str) or not text:
        return None
    value = text.strip().replace("Z", "+00:00")
    if "." in value:  # Python parses at most 6 fractional digits; Go writes up to 9
        head, _, rest = value.partition(".")
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]  # the fraction only, not the offset's digits
        value = f"{head}.{digits[:6]}{rest[len(digits) :]}"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp()


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
