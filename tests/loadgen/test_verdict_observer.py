"""The verdict's observer (loadgen/verdict/observer.py): the alerts and pages of a window from stand-ins
answering like Prometheus and the pager, on a scripted clock."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loadgen.verdict import observer as V
from loadgen.verdict.checks import iso
from loadlens.contracts.results import VerdictAlert, VerdictPage
from tests.support.server import serve_app

T0 = 1_800_000_000.0  # the run's start (Unix seconds)


def test_go_times_with_nanoseconds_parse() -> None:
    assert V.parse_time("2027-01-15T08:00:00.123456789Z") == pytest.approx(1_800_000_000.123456, abs=1e-6)
    assert V.parse_time("2027-01-15T08:00:00Z") == 1_800_000_000.0
    assert V.parse_time("garbage") is None


def test_a_fraction_keeps_its_offset_whatever_the_machines_time_zone() -> None:
    """The fraction's digits end where the offset begins: the offset's digits were once taken as more of the
    fraction, which dropped the offset and read the time as the machine's local time (off by hours on a
    machine not on UTC; the verdict then counted the wrong alerts)."""
    utc = 1_800_000_000.5  # 2027-01-15T08:00:00.5Z
    assert V.parse_time("2027-01-15T08:00:00.5Z") == utc
    assert V.parse_time("2027-01-15T09:00:00.5+01:00") == utc
    assert V.parse_time("2027-01-15T03:00:00.123456789-05:00") == pytest.approx(1_800_000_000.123456, abs=1e-6)
    assert V.parse_time("2027-01-15T08:00:00.5") == utc  # no offset: UTC


# --- the window's alerts and pages, from stand-ins answering like Prometheus and the pager -------------------


def _iso(ts: float) -> str:
    return iso(ts)


class Fake:
    """Prometheus rules/query_range and the pager's /pages, scripted by the test; time is the fake clock's."""

    def __init__(self) -> None:
        self.t = T0 + 60
        self.rules: list[dict[str, Any]] = []
        self.firing: list[dict[str, Any]] = []
        self.for_state: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []
        self.on_sleep: list[Any] = []
        self.targets: list[dict[str, Any]] | None = None  # None: no targets endpoint (404), like a querier
        self.evaluated: dict[str, float] | None = None  # lastEvaluation per group; None: not reported

    def app(self) -> Starlette:
        async def rules(request: Request) -> JSONResponse:
            groups: list[dict[str, Any]] = [{"name": "g", "interval": 2, "rules": self.rules}]
            if self.evaluated is not None:  # a recording group, then the alerting group that reads it
                groups = [{"name": "recording", "interval": 2, "rules": [{"name": "r", "type": "recording"}]},
                          *groups]  # fmt: skip
                for group in groups:
                    group["lastEvaluation"] = _iso(self.evaluated[str(group["name"])])
            return JSONResponse({"status": "success", "data": {"groups": groups}})

        async def targets(request: Request) -> JSONResponse:
            if self.targets is None:
                return JSONResponse({"status": "error", "error": "not found"}, status_code=404)
            return JSONResponse({"status": "success", "data": {"activeTargets": self.targets}})

        async def query_range(request: Request) -> JSONResponse:
            q = parse_qs(request.url.query)["query"][0]
            result = self.firing if q.startswith("ALERTS{") else self.for_state
            return JSONResponse({"status": "success", "data": {"resultType": "matrix", "result": result}})

        async def pages(request: Request) -> JSONResponse:
            return JSONResponse({"notifications": self.notifications})

        return Starlette(routes=[Route("/api/v1/rules", rules), Route("/api/v1/query_range", query_range),
                                 Route("/api/v1/targets", targets), Route("/pages", pages)])  # fmt: skip

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        while self.on_sleep and self.on_sleep[0][0] <= self.t:
            self.on_sleep.pop(0)[1]()


@pytest.fixture
def fake() -> Iterator[tuple[Fake, str]]:
    f = Fake()
    with serve_app(f.app()) as url:
        yield f, url


def _rule(duration: float, *alerts: dict[str, Any]) -> dict[str, Any]:
    return {"name": "TTFT", "type": "alerting", "duration": duration, "alerts": list(alerts)}


LABELS = {"alertname": "LoadlensTTFTP99High", "severity": "critical", "slo": "ttft", "priority_class": "interactive"}


def test_observe_waits_out_a_pending_alert_and_its_page_and_drops_earlier_runs(fake: tuple[Fake, str]) -> None:
    f, url = fake
    end = T0 + 60
    # At the end of the run the TTFT alert has been pending for 40 s of its 60 s `for:`; an older alert (from
    # before the run) is firing.
    old = {**LABELS, "alertname": "Old"}
    f.rules = [_rule(60, {"labels": LABELS, "state": "pending", "activeAt": _iso(end - 40)}),
               _rule(60, {"labels": old, "state": "firing", "activeAt": _iso(T0 - 300)})]  # fmt: skip
    fire_at, paged_at = end + 22, end + 27

    def fires() -> None:
        f.rules[0]["alerts"][0]["state"] = "firing"

    def pages() -> None:
        alert = {"status": "firing", "labels": LABELS, "startsAt": _iso(fire_at)}
        earlier = {"status": "resolved", "labels": old, "startsAt": _iso(T0 - 240)}
        f.notifications = [
            {"received_at": T0 - 100, "receiver": "pager", "alerts": [{**earlier, "status": "firing"}]},
            {"received_at": paged_at, "receiver": "pager", "alerts": [alert]},
            {"received_at": paged_at + 1, "receiver": "pager", "alerts": [earlier]},
        ]
        ts = [[fire_at + i, "1"] for i in range(0, 8, 2)]
        f.firing = [{"metric": {**LABELS, "__name__": "ALERTS", "alertstate": "firing"}, "values": ts},
                    {"metric": {**old, "__name__": "ALERTS", "alertstate": "firing"},
                     "values": [[T0 + i, "1"] for i in range(0, 80, 2)]}]  # fmt: skip
        f.for_state = [{"metric": {**LABELS, "__name__": "ALERTS_FOR_STATE"}, "values": [[t, str(end - 40)] for t, _
                        in ts]},
                       {"metric": {**old, "__name__": "ALERTS_FOR_STATE"},
                        "values": [[T0 + i, str(T0 - 300)] for i in range(0, 80, 2)]}]  # fmt: skip

    f.on_sleep = [(fire_at, fires), (paged_at, pages)]
    said: list[str] = []
    obs = V.observe(start=T0, end=end, prometheus_url=url, pager_url=url, wait_limit=120, now=lambda: f.t,
                    sleep=f.sleep, say=said.append)  # fmt: skip
    assert obs.errors == []
    assert obs.window.waited_seconds == 27.0 and obs.window.wait_limit_seconds == 120
    assert said == [
        "waiting up to 120 s for alerts to settle: LoadlensTTFTP99High (pending)",
        "waiting up to 98 s for alerts to settle: LoadlensTTFTP99High (not paged yet)",
    ]
    assert obs.alerts == [
        VerdictAlert(alertname="LoadlensTTFTP99High", severity="critical", state="firing", starts_at=_iso(fire_at),
                     labels={"priority_class": "interactive", "slo": "ttft"})
    ]  # fmt: skip
    assert obs.pages == [
        VerdictPage(alertname="LoadlensTTFTP99High", severity="critical", receiver="pager", status="firing",
                    at=_iso(paged_at))
    ]  # fmt: skip


def test_observe_is_bounded_and_keeps_what_cannot_fire_in_time_as_pending(fake: tuple[Fake, str]) -> None:
    f, url = fake
    end = T0 + 60
    burn = {**LABELS, "alertname": "LoadlensTTFTErrorBudgetBurn", "severity": "warning"}
    f.rules = [_rule(3600, {"labels": burn, "state": "pending", "activeAt": _iso(end - 10)})]
    obs = V.observe(start=T0, end=end, prometheus_url=url, pager_url=None, wait_limit=120, now=lambda: f.t,
                    sleep=f.sleep)  # fmt: skip
    assert obs.window.waited_seconds == 4.0  # two evaluations (2 s each), not the hour it would take to fire
    assert [(a.alertname, a.state, a.starts_at) for a in obs.alerts] == [
        ("LoadlensTTFTErrorBudgetBurn", "pending", _iso(end - 10))
    ]
    assert obs.pages_source is None and obs.pages == []


def _target(job: str, health: str, last_scrape: float, duration: float = 0.25) -> dict[str, Any]:
    return {"labels": {"job": job}, "health": health, "lastScrape": _iso(last_scrape),
            "lastScrapeDuration": duration}  # fmt: skip


def test_freshness_waits_for_a_scrape_after_the_end_then_two_rounds_of_evaluations() -> None:
    end = T0 + 60
    fresh = V.Freshness(end)
    down = _target("loadlens-gpu", "down", end - 30)  # down: delivers nothing more, not waited for
    groups = [{"name": "recording", "lastEvaluation": _iso(end + 1)},
              {"name": "alerts", "lastEvaluation": _iso(end + 1.5)}]  # fmt: skip
    targets = [_target("loadlens-serve", "up", end - 4), down]
    assert fresh.waiting(targets, groups) == ["a scrape of loadlens-serve after the run"]
    targets[0] = _target("loadlens-serve", "up", end + 6, duration=0.5)  # its samples queryable from end + 6.5
    groups = [{"name": "recording", "lastEvaluation": _iso(end + 7)},
              {"name": "alerts", "lastEvaluation": _iso(end + 5.5)}]  # fmt: skip
    assert fresh.waiting(targets, groups) == ["rule group alerts to evaluate the run's last samples"]
    assert fresh.scraped == end + 6.5 and fresh.judged is None
    groups[1]["lastEvaluation"] = _iso(end + 7.5)  # evaluated after the scrape, but the recording group's
    assert fresh.waiting(targets, groups) == ["rule group recording to evaluate the run's last samples"]
    assert fresh.judged == end + 7.5  # output of those samples came at end + 7: the alerts read it at 7.5,
    groups[0]["lastEvaluation"] = _iso(end + 9)  # and every group has evaluated once more since
    assert fresh.waiting(targets, groups) == []


def test_freshness_cannot_tell_without_targets_or_evaluation_times() -> None:
    fresh = V.Freshness(T0)
    assert fresh.waiting(None, [{"name": "g", "lastEvaluation": _iso(T0 + 5)}]) is None
    assert fresh.waiting([_target("j", "up", T0 + 1)], [{"name": "g"}]) is None
    assert fresh.waiting([], [{"name": "g", "lastEvaluation": _iso(T0 + 1)}]) == []  # no targets up


def _scrape_every_10_s_and_evaluate_every_2_s(f: Fake, end: float) -> None:
    """A Prometheus scraping every 10 s (last before the end at end - 2, next at end + 8) and evaluating every
    2 s; the scrape at end + 8 holds the run's last seconds, whose TTFT makes the alert pending at end + 10."""
    f.targets = [_target("loadlens-serve", "up", end - 2)]
    f.evaluated = {"recording": end - 1, "g": end - 0.5}
    labels = {**LABELS, "alertname": "Late"}

    def evaluates(at: float) -> Callable[[], None]:
        return lambda: f.evaluated.update(recording=at, g=at + 0.5) if f.evaluated is not None else None

    def scrapes() -> None:
        f.targets = [_target("loadlens-serve", "up", end + 8)]

    def pends() -> None:
        f.rules.append(_rule(30, {"labels": labels, "state": "pending", "activeAt": _iso(end + 9.5)}))

    def fires() -> None:
        f.rules[0]["alerts"][0]["state"] = "firing"
        f.firing = [{"metric": {**labels, "__name__": "ALERTS", "alertstate": "firing"}, "values": [[end + 40, "1"]]}]
        f.for_state = [{"metric": {**labels, "__name__": "ALERTS_FOR_STATE"}, "values": [[end + 40, str(end + 9.5)]]}]

    events: list[tuple[float, Callable[[], None]]] = [(end + 2 * k + 1, evaluates(end + 2 * k + 1)) for k in range(40)]
    events += [(end + 8, scrapes), (end + 10, pends), (end + 40, fires)]
    f.on_sleep = sorted(events, key=lambda e: e[0])


def test_observe_waits_for_the_runs_last_scrape_when_scrapes_are_slower_than_evaluations(
    fake: tuple[Fake, str],
) -> None:
    """Two evaluation intervals (4 s) pass before the scrape that holds the run's last seconds (8 s): the old
    rule stopped there and saw no alert; Prometheus's own bookkeeping keeps the wait going until that scrape
    is judged, the alert it raises is pending, and its firing 30 s later is waited out."""
    f, url = fake
    end = T0 + 60
    _scrape_every_10_s_and_evaluate_every_2_s(f, end)
    said: list[str] = []
    obs = V.observe(start=T0, end=end, prometheus_url=url, pager_url=None, wait_limit=120, now=lambda: f.t,
                    sleep=f.sleep, say=said.append)  # fmt: skip
    assert [(a.alertname, a.state, a.starts_at) for a in obs.alerts] == [("Late", "firing", _iso(end + 40))]
    assert obs.window.waited_seconds == 40.0 and obs.window.unsettled == []
    # Told at end + 10 (TELL_LATE_S): the recording group has yet to evaluate once more (end + 11).
    assert said == [
        "waiting up to 110 s for alerts to settle: Prometheus to scrape and judge the run's last samples, Late "
        "(pending)",
    ]


def test_without_a_targets_endpoint_the_wait_is_two_evaluations(fake: tuple[Fake, str]) -> None:
    f, url = fake
    end = T0 + 60
    _scrape_every_10_s_and_evaluate_every_2_s(f, end)
    f.targets = None  # a querier without /api/v1/targets: the fallback, which misses the late scrape
    obs = V.observe(start=T0, end=end, prometheus_url=url, pager_url=None, wait_limit=120, now=lambda: f.t,
                    sleep=f.sleep)  # fmt: skip
    assert obs.alerts == [] and obs.window.waited_seconds == 4.0


def test_a_stalled_prometheus_ends_the_wait_at_the_bound_and_says_what_it_waited_for(
    fake: tuple[Fake, str],
) -> None:
    f, url = fake
    end = T0 + 60
    f.targets = [_target("loadlens-serve", "up", end - 1)]  # never scraped again
    f.evaluated = {"recording": end + 1, "g": end + 1}
    said: list[str] = []
    obs = V.observe(start=T0, end=end, prometheus_url=url, pager_url=None, wait_limit=30, now=lambda: f.t,
                    sleep=f.sleep, say=said.append)  # fmt: skip
    assert obs.window.waited_seconds == 30.0
    assert obs.window.unsettled == ["a scrape of loadlens-serve after the run"]
    assert said == ["waiting up to 20 s for alerts to settle: Prometheus to scrape and judge the run's last samples"]


def test_observe_names_what_it_could_not_read() -> None:
    obs = V.observe(start=T0, end=T0 + 60, prometheus_url="http://127.0.0.1:9", pager_url="http://127.0.0.1:9",
                    now=lambda: T0 + 61)  # fmt: skip
    assert obs.errors == [
        "alerts: Prometheus http://127.0.0.1:9: cannot reach Prometheus at http://127.0.0.1:9: [Errno 111] "
        "Connection refused",
        "pages: pager http://127.0.0.1:9: [Errno 111] Connection refused",
    ]
    assert (obs.alerts, obs.pages) == ([], [])


def test_the_pagers_log_file_is_read_whole_and_scoped_to_the_window(tmp_path: Any) -> None:
    log = tmp_path / "pages.jsonl"
    assert V.fetch_notifications(str(log)) == []  # no log yet: no pages
    earlier = {
        "received_at": T0 - 50,
        "receiver": "pager",
        "alerts": [{"status": "firing", "labels": LABELS, "startsAt": _iso(T0 - 55)}],
    }
    resolved_late = {
        "received_at": T0 + 10,
        "receiver": "pager",
        "alerts": [{"status": "resolved", "labels": LABELS, "startsAt": _iso(T0 - 55)}],
    }
    ours = {
        "received_at": T0 + 70,
        "receiver": "ticket",
        "alerts": [{"status": "firing", "labels": {**LABELS, "severity": "warning"}, "startsAt": _iso(T0 + 64)}],
    }
    after = {"received_at": T0 + 500, "receiver": "pager",
             "alerts": [{"status": "firing", "labels": LABELS, "startsAt": _iso(T0 + 490)}]}  # fmt: skip
    lines = [json.dumps(n) for n in (earlier, resolved_late, ours, after)]
    log.write_text("\n".join(lines) + '\n{"received_at": ')  # the pager is writing a line as we read
    notifications = V.fetch_notifications(str(log))
    assert len(notifications) == 4
    assert V.pages_in_window(notifications, T0, T0 + 100) == [
        VerdictPage(alertname="LoadlensTTFTP99High", severity="warning", receiver="ticket", status="firing",
                    at=_iso(T0 + 70))
    ]  # fmt: skip
