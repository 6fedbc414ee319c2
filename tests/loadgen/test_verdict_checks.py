"""The verdict's checks (loadgen/verdict/checks.py) against hand-built results: every check, the headline,
exactly."""

from __future__ import annotations

from typing import Any

from loadgen.verdict import checks as V
from loadlens.contracts.results import BenchmarkResult, SLOCheck, VerdictAlert, VerdictPage, parse_result
from loadlens.contracts.slo import load_slos

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
