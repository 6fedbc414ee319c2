"""The verdict (loadlens/util/verdict.py) against hand-built results: every check, the headline, exactly; the
alerts and pages of a window from a stand-in Prometheus and pager."""

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

from loadlens.contracts.results import BenchmarkResult, SLOCheck, VerdictAlert, VerdictPage, parse_result
from loadlens.contracts.slo import load_slos
from loadlens.util import verdict as V
from tests.support.server import serve_app

SLOS = load_slos()
T0 = 1_800_000_000.0  # the run's start (Unix seconds)


def _class(p99_ttft: float, p99_itl: float, p99_e2e: float, goodput: float) -> dict[str, Any]:
    return {"completed": 100, "p99_ttft_ms": p99_ttft, "p99_itl_ms": p99_itl, "p99_e2el_ms": p99_e2e,
            "goodput_ratio": goodput}  # fmt: skip


def _stage(name: str, *, warmup: bool = False, failed: int = 0, **classes: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "warmup": warmup, "completed": 200, "failed": failed, "classes": classes}


def _result(stages: list[dict[str, Any]], overall: dict[str, Any], **extra: Any) -> BenchmarkResult:
    doc = {
        "schema": "loadlens.benchmark_result",
        "schema_version": 1,
        "run": {"start_timestamp": T0, "end_timestamp": T0 + 60, "start_time": "2027-01-15T08:00:00.000Z",
                "end_time": "2027-01-15T08:01:00.000Z"},
        "profile": {"name": "p", "traffic": [
            {"name": "chat", "weight": 7, "share": 0.7, "endpoint": "chat", "priority_class": "interactive"},
            {"name": "sum", "weight": 3, "share": 0.3, "endpoint": "chat", "priority": 10, "priority_class": "batch"},
        ]},
        "stages": stages,
        "overall": overall,
        **extra,
    }  # fmt: skip
    return parse_result(doc)


GOOD = _class(150.0, 30.0, 5000.0, 0.995)
BATCH = _class(900.0, 60.0, 40000.0, 0.99)


def test_a_passing_run_checks_every_slo_of_every_class_stage_and_overall() -> None:
    result = _result(
        [_stage("warmup", warmup=True, interactive=_class(900, 90, 9e4, 0.1)), _stage("c8", interactive=GOOD,
         batch=BATCH)],
        {"completed": 200, "failed": 0, "classes": {"interactive": GOOD, "batch": BATCH}},
    )  # fmt: skip
    v = V.build_verdict(result, SLOS)
    assert v.status == "pass"
    assert v.headline == "PASS: 18 SLO checks passed over 1 stage and overall; alerts not checked"
    assert [(c.stage, c.priority_class, c.slo, c.statistic, c.comparison, c.threshold, c.observed, c.unit, c.passed)
            for c in v.slos if c.stage == "c8"] == [
        ("c8", "interactive", "ttft", "p99", "<=", 200.0, 150.0, "ms", True),
        ("c8", "interactive", "itl", "p99", "<=", 50.0, 30.0, "ms", True),
        ("c8", "interactive", "e2e", "p99", "<=", 20000.0, 5000.0, "ms", True),
        ("c8", "interactive", "goodput", "ratio", ">=", 0.9, 0.995, "ratio", True),
        ("c8", "batch", "ttft", "p99", "<=", 2500.0, 900.0, "ms", True),
        ("c8", "batch", "itl", "p99", "<=", 100.0, 60.0, "ms", True),
        ("c8", "batch", "e2e", "p99", "<=", 120000.0, 40000.0, "ms", True),
        ("c8", "batch", "goodput", "ratio", ">=", 0.9, 0.99, "ratio", True),
        ("c8", None, "error_ratio", "ratio", "<=", 0.001, 0.0, "ratio", True),
    ]  # fmt: skip
    assert {c.stage for c in v.slos} == {"c8", "overall"}  # the warmup is never judged
    assert v.stages == {"c8": "pass", "overall": "pass"}
    assert v.window.start == "2027-01-15T08:00:00.000Z" and v.window.end_timestamp == T0 + 60


def test_a_breach_names_each_failed_slo_with_its_stages() -> None:
    slow = _class(450.0, 30.0, 5000.0, 0.316)
    result = _result(
        [_stage("c8", interactive=GOOD, batch=BATCH), _stage("c16", interactive=slow, batch=BATCH),
         _stage("c32", failed=2, interactive=slow, batch={**BATCH, "p99_itl_ms": 100.5})],
        {"completed": 600, "failed": 2, "classes": {"interactive": slow, "batch": BATCH}},
    )  # fmt: skip
    v = V.build_verdict(result, SLOS)
    assert v.status == "fail"
    assert v.headline == (
        "FAIL: TTFT p99 (interactive) at c16/c32 above 200 ms; goodput (interactive) at c16/c32 below 90 %; "
        "ITL p99 (batch) at c32 above 100 ms; error ratio at c32 above 0.1 %; alerts not checked"
    )
    assert list(v.stages.items()) == [("c8", "pass"), ("c16", "fail"), ("c32", "fail"), ("overall", "fail")]
    failed = [(c.stage, c.priority_class, c.slo, c.observed) for c in v.slos if c.passed is False]
    assert failed == [
        ("c16", "interactive", "ttft", 450.0), ("c16", "interactive", "goodput", 0.316),
        ("c32", "interactive", "ttft", 450.0), ("c32", "interactive", "goodput", 0.316),
        ("c32", "batch", "itl", 100.5), ("c32", None, "error_ratio", 0.009901),
        ("overall", "interactive", "ttft", 450.0), ("overall", "interactive", "goodput", 0.316),
        ("overall", None, "error_ratio", 0.003322),  # 2 of 602
    ]  # fmt: skip


def test_one_class_leaves_the_class_out_of_the_headline_and_no_requests_is_unknown() -> None:
    one = _result([_stage("c8", interactive=_class(250.0, 30.0, 5000.0, 0.95))], {"completed": 200, "failed": 0,
                  "classes": {"interactive": _class(250.0, 30.0, 5000.0, 0.95)}})  # fmt: skip
    assert V.build_verdict(one, SLOS).headline == "FAIL: TTFT p99 at c8 above 200 ms; alerts not checked"
    empty = _result([{"name": "c8", "completed": 0, "failed": None}], {"completed": 0, "failed": None})
    v = V.build_verdict(empty, SLOS)
    assert (v.status, v.headline) == ("unknown", "UNKNOWN: no SLO could be judged (no completed requests); "
                                      "alerts not checked")  # fmt: skip
    assert all(c.passed is None and c.observed is None for c in v.slos)
    assert v.stages == {"c8": "unknown", "overall": "unknown"}


def test_the_hot_swap_sla_is_judged_only_where_swaps_blocked_requests() -> None:
    swaps = {"lora_swap_blocked_requests": 40.0, "lora_swap_delayed_requests": 3.0, "slo_eligible_requests": 400.0}
    none = {"lora_swap_blocked_requests": 0.0, "lora_swap_delayed_requests": 0.0, "slo_eligible_requests": 400.0}
    result = _result(
        [{**_stage("c8", interactive=GOOD), "server": none}, {**_stage("c16", interactive=GOOD), "server": swaps}],
        {"completed": 400, "failed": 0, "classes": {"interactive": GOOD}},
    )
    checks = [c for c in V.build_verdict(result, SLOS).slos if c.slo == "lora_swap"]
    assert checks == [
        SLOCheck(slo="lora_swap", stage="c16", statistic="ratio", threshold=0.005, observed=0.0075, unit="ratio",
                 passed=False),
        SLOCheck(slo="lora_swap", stage="overall", statistic="ratio", threshold=0.005, observed=0.00375,
                 unit="ratio", passed=True),
    ]  # fmt: skip


def test_alerts_pages_and_invalid_results_reach_the_headline() -> None:
    result = _result([_stage("c8", interactive=GOOD)], {"completed": 200, "failed": 0,
                     "classes": {"interactive": GOOD}}, validity={"results_valid": False})  # fmt: skip
    obs = V.Observation(
        window=V.run_window(result),
        alerts=[VerdictAlert(alertname="A", state="resolved"), VerdictAlert(alertname="B", state="pending")],
        pages=[VerdictPage(alertname="A", receiver="pager", status="firing", at="x"),
               VerdictPage(alertname="A", receiver="pager", status="resolved", at="y")],
        alerts_source="http://p", pages_source="http://g",
    )  # fmt: skip
    assert V.build_verdict(result, SLOS, obs).headline == (
        "PASS: 10 SLO checks passed over 1 stage and overall; 1 alert fired, 1 still pending; 1 page; "
        "results invalid (load generator CPU-bound)"
    )


def test_pages_to_several_receivers_are_counted_by_receiver() -> None:
    result = _result([_stage("c8", interactive=GOOD)], {"completed": 200, "failed": 0,
                     "classes": {"interactive": GOOD}})  # fmt: skip
    pages = [VerdictPage(alertname=n, receiver=r, status="firing", at="x")
             for n, r in (("A", "pager"), ("B", "ticket"), ("C", "pager"))]  # fmt: skip
    obs = V.Observation(window=V.run_window(result), pages=pages, alerts_source="http://p", pages_source="http://g")
    assert V.build_verdict(result, SLOS, obs).headline == (
        "PASS: 10 SLO checks passed over 1 stage and overall; no alerts fired; 3 pages (2 pager, 1 ticket)"
    )


def test_go_times_with_nanoseconds_parse() -> None:
    assert V.parse_time("2027-01-15T08:00:00.123456789Z") == pytest.approx(1_800_000_000.123456, abs=1e-6)
    assert V.parse_time("2027-01-15T08:00:00Z") == 1_800_000_000.0
    assert V.parse_time("garbage") is None


# --- the window's alerts and pages, from stand-ins answering like Prometheus and the pager -------------------


def _iso(ts: float) -> str:
    return V.iso(ts)


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
