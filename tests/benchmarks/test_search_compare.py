"""benchmarks/search_compare.py's pure pieces, in benchmarks/search_judge.py: the server-side judgement of a
run, the ground truth's capacity and band, a search's bracket, and the request-log parser, on hand-made data
with known answers."""

from __future__ import annotations

import json

import pytest

from benchmarks.search_judge import (
    Objectives,
    Served,
    agreement,
    bracket,
    capacity,
    judge_served,
    parse_served,
    percentile,
)

OBJ = Objectives(ttft_ms=200.0, itl_ms=50.0, e2e_ms=20000.0, ratio=0.99, goodput_min=0.9, error_max=0.001)


def served(ttfts: list[float], tpot: float = 7.0, status: int = 200) -> list[Served]:
    return [Served(end=100.0 + i, status=status, ttft_ms=t, tpot_ms=tpot, e2e_ms=900.0) for i, t in enumerate(ttfts)]


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([10.0], 0.99) == 10.0
    assert percentile(list(map(float, range(101))), 0.99) == 99.0


def test_a_run_fails_on_its_p99_ttft_though_goodput_is_met() -> None:
    # 100 requests, 2 of them late: goodput 98 % >= 90 %, but the p99 TTFT (interpolated) is above 200 ms
    row = judge_served(served([50.0] * 98 + [400.0, 400.0]), OBJ)
    assert row["n"] == 100 and row["goodput_ratio"] == 0.98
    assert row["ttft_p99"] == 400.0 and row["passes"] is False
    one_late = judge_served(served([50.0] * 99 + [400.0]), OBJ)
    assert one_late["ttft_p99"] == pytest.approx(53.5)  # one late request in 100 is 1 %: the p99 still passes
    assert one_late["passes"] is True


def test_server_errors_count_against_the_error_budget() -> None:
    row = judge_served(served([50.0] * 99) + served([0.0], status=500), OBJ)
    assert row["error_ratio"] == 0.01 and row["passes"] is False


def test_truth_capacity_and_band() -> None:
    runs = {11: [True, True], 12: [True, False], 13: [True, False, False], 14: [False, False]}
    assert capacity(runs) == (11, [12, 13])  # 12 passes one of two: not most
    assert capacity({4: [True], 8: [False], 16: [True]}) == (4, [])  # a pass above a fail does not count
    assert capacity({1: [False]}) == (None, [])


def test_agreement_with_the_truth() -> None:
    assert agreement(12.0, 12, []) == "same"
    assert agreement(13.0, 12, [12, 13]) == "in band"
    assert agreement(9.0, 12, [12]) == "-3"
    assert agreement(None, 12, []) == "-"
    assert agreement(9.0, 12, [], censored=True) == "<=-3"  # the truth's top level passed: 12 is a lower bound


def test_bracket_of_a_search() -> None:
    assert bracket([(8.0, True), (16.0, False), (12.0, True), (14.0, False), (13.0, True)]) == (13.0, 14.0)
    assert bracket([(8.0, False), (4.0, False)]) == (None, 4.0)
    assert bracket([(8.0, True), (16.0, True)]) == (16.0, None)


def test_parse_served_reads_request_lines_only() -> None:
    line = {"ts": "2026-12-02T01:45:17.783Z", "level": "info", "msg": "request", "status": 200, "ttft_ms": 13.5,
            "tpot_ms": 6.4, "e2e_ms": 834.0}  # fmt: skip
    lines = ["loadlens serve: engine=sim", json.dumps(line), json.dumps({**line, "msg": "other"}), "{bad"]
    (req,) = parse_served(lines)
    assert req.status == 200 and req.ttft_ms == 13.5 and req.e2e_ms == 834.0
    assert round(req.end - req.start, 3) == 0.834
