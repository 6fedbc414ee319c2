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
TELL_LATE_S = 10.0
"""After the run's end, how long Prometheus may take to scrape and judge its last samples before the wait says
it is waiting for that (at least four evaluation intervals: a scrape interval and two evaluations is routine)."""
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


class Freshness:
    """Whether Prometheus has judged the run's last samples, read from its own bookkeeping rather than assumed
    from the evaluation interval (a scrape interval longer than the evaluation interval, or a Prometheus too
    busy to keep its schedule, leaves the run's last seconds unjudged for longer than two evaluations):

    1. every target that is up has been scraped since the run's end; ``scraped`` is then the latest end of
       those scrapes (``lastScrape`` + ``lastScrapeDuration``: its samples are queryable from there);
    2. every rule group has evaluated since ``scraped``; ``judged`` is then the latest of those evaluations;
    3. every rule group has evaluated since ``judged``: an alerting group reading a recording group's output
       has seen the output computed from those samples.

    A target that is down is not waited for (it delivers nothing more). :meth:`waiting` is None where the API
    lacks what this needs (no targets endpoint, no ``lastEvaluation``); the caller then falls back to two
    evaluation intervals past the end.
    """

    def __init__(self, end: float) -> None:
        self.end = end
        self.scraped: float | None = None
        self.judged: float | None = None

    def waiting(
        self, targets: Sequence[Mapping[str, Any]] | None, groups: Sequence[Mapping[str, Any]]
    ) -> list[str] | None:
        if targets is None:
            return None
        evaluated = {str(g.get("name")): parse_time(g.get("lastEvaluation")) for g in groups}
        if any(t is None for t in evaluated.values()):
            return None
        if self.scraped is None:
            up = [t for t in targets if t.get("health") == "up"]
            behind = sorted({
                str((t.get("labels") or {}).get("job", "?"))
                for t in up
                if (parse_time(t.get("lastScrape")) or 0.0) < self.end
            })  # fmt: skip
            if behind:
                return [f"a scrape of {job} after the run" for job in behind]
            ends = [(parse_time(t.get("lastScrape")) or 0.0) + float(t.get("lastScrapeDuration") or 0.0) for t in up]
            self.scraped = max([self.end, *ends])
        bound = self.scraped if self.judged is None else self.judged
        late = sorted(name for name, at in evaluated.items() if at is None or at < bound)
        if late:
            return [f"rule group {name} to evaluate the run's last samples" for name in late]
        if self.judged is None:
            self.judged = max((at for at in evaluated.values() if at is not None), default=bound)
            return self.waiting(targets, groups)
        return []


def _targets(client: PrometheusClient) -> list[dict[str, Any]] | None:
    try:
        return client.active_targets()
    except QueryError:  # a querier without a targets endpoint: fall back to the evaluation interval
        return None


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

    Settled means: Prometheus has scraped and judged the run's last samples (:class:`Freshness`; where its
    API cannot tell, two rule evaluations past ``end``), no alert that became pending in the window can still
    fire before the bound (activeAt + for:), and every alert of the window that fired has reached the pager
    (``pager_url``: its URL, or its log file ``pages.jsonl``), or has had :data:`PAGE_GRACE_S` to do so (an
    alert routed nowhere never arrives). What it still waited for at the bound is ``window.unsettled``.
    Without ``prometheus_url`` there is nothing to wait for and only the pages are read.
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
            fresh = Freshness(end)
            first_firing: dict[LabelKey, float] = {}
            told: set[str] = set()
            while True:
                t = now()
                judging = fresh.waiting(_targets(client), groups)
                if judging is None:
                    judging = [f"{2 * interval:g} s of rule evaluations after the run"] if t < earliest else []
                waiting: list[str] = list(judging)
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
                if not waiting:
                    break
                if t >= deadline:
                    window.unsettled = waiting
                    break
                # Prometheus catching up is routine (a scrape interval and two evaluations), told in one phrase
                # and only past TELL_LATE_S or four evaluations; an alert or a page is told at once.
                tell = [w for w in waiting if w not in judging]
                if judging and t >= end + max(TELL_LATE_S, 4 * interval):
                    tell.insert(0, "Prometheus to scrape and judge the run's last samples")
                if tell and not told.issuperset(tell):
                    say(f"waiting up to {max(0.0, deadline - t):.0f} s for alerts to settle: {', '.join(tell)}")
                    told.update(tell)
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
