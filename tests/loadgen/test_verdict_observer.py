"""The verdict's observer (loadgen/verdict/observer.py): the alerts and pages of a window from stand-ins
answering like Prometheus and the pager, on a scripted clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
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

    def app(self) -> Starlette:
        async def rules(request: Request) -> JSONResponse:
            groups = [{"name": "g", "interval": 2, "rules": self.rules}]
            return JSONResponse({"status": "success", "data": {"groups": groups}})

        async def query_range(request: Request) -> JSONResponse:
            q = parse_qs(request.url.query)["query"][0]
            result = self.firing if q.startswith("ALERTS{") else self.for_state
            return JSONResponse({"status": "success", "data": {"resultType": "matrix", "result": result}})

        async def pages(request: Request) -> JSONResponse:
            return JSONResponse({"notifications": self.notifications})

        return Starlette(routes=[Route("/api/v1/rules", rules), Route("/api/v1/query_range", query_range),
                                 Route("/pages", pages)])  # fmt: skip

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
    assert said == ["waiting up to 120 s for alerts to settle: LoadlensTTFTP99High (pending)"]
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
