"""slo-search's plan on synthetic outcomes with a known capacity: bracketing then bisection end on the
capacity and the level above it; the range ends and the tolerance stop it; bad search sections exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.cli import main
from loadlens.contracts.experiment_result import TrialRun
from loadlens.experiment.models import Search
from loadlens.experiment.search import level_outcome, oversaturated, plan_next, repeat_passes


def search_for(capacity: float, **fields: Any) -> tuple[list[float], dict[float, bool]]:
    search = Search(**{"var": "level", "start": 8, "max": 512, **fields})
    outcomes: dict[float, bool] = {}
    order: list[float] = []
    while (level := plan_next(search, outcomes)) is not None:
        assert level not in outcomes
        order.append(level)
        outcomes[level] = level <= capacity
    return order, outcomes


def bracket(outcomes: dict[float, bool]) -> tuple[float | None, float | None]:
    lo = max((lv for lv, ok in outcomes.items() if ok), default=None)
    hi = min((lv for lv, ok in outcomes.items() if not ok and (lo is None or lv > lo)), default=None)
    return lo, hi


@pytest.mark.parametrize("capacity", [1, 2, 7, 8, 9, 37, 100, 255, 511])
def test_integer_search_ends_on_the_capacity(capacity: int) -> None:
    order, outcomes = search_for(capacity)
    assert bracket(outcomes) == (capacity, capacity + 1)
    assert len(order) <= 2 * 10  # doubling then bisection: logarithmic


def test_the_order_doubles_then_bisects() -> None:
    order, _ = search_for(37)
    assert order == [8, 16, 32, 64, 48, 40, 36, 38, 37]


def test_range_ends_stop_the_search() -> None:
    order, outcomes = search_for(10_000)
    assert order == [8, 16, 32, 64, 128, 256, 512] and bracket(outcomes) == (512, None)
    order, outcomes = search_for(0)
    assert order == [8, 4, 2, 1] and bracket(outcomes) == (None, 1)


def test_a_rate_search_stops_at_the_tolerance() -> None:
    order, outcomes = search_for(13.3, start=4.0, min=0.5, max=100.0, integer=False, tolerance=0.05)
    lo, hi = bracket(outcomes)
    assert lo is not None and hi is not None
    assert lo <= 13.3 < hi and (hi - lo) / lo <= 0.05
    assert order[:3] == [4.0, 8.0, 16.0]


def test_pass_rule() -> None:
    s = Search(var="level", start=1, max=2, goodput_target=0.9, oversaturated_goodput=0.25)
    assert repeat_passes(s, {"goodput_ratio": 0.95}, "pass") is True
    assert repeat_passes(s, {"goodput_ratio": 0.95}, "fail") is False  # an SLO check failed
    assert repeat_passes(s.model_copy(update={"every_slo": False}), {"goodput_ratio": 0.95}, "fail") is True
    assert repeat_passes(s, {"goodput_ratio": 0.89}, "pass") is False
    assert oversaturated(s, {"goodput_ratio": 0.2}) and not oversaturated(s, {"goodput_ratio": 0.3})


def _run(ok: bool, goodput: float = 0.95) -> TrialRun:
    return TrialRun(
        repeat=1, run_id="r", result_path="x", log_path="y", exit_code=0, completed=True, start_timestamp=0.0,
        end_timestamp=0.0, duration_s=0.0, figures={"goodput_ratio": goodput}, verdict_status="pass" if ok else "fail",
    )  # fmt: skip


def test_a_failure_counts_only_once_confirmed() -> None:
    s = Search(var="level", start=1, max=2, confirm_failures=1)
    assert level_outcome(s, [], 1) is None
    assert level_outcome(s, [_run(True)], 1) is True
    assert level_outcome(s, [_run(False)], 1) is None  # one more run decides
    assert level_outcome(s, [_run(False), _run(True)], 1) is True  # the failure did not reproduce
    assert level_outcome(s, [_run(False), _run(False)], 1) is False
    assert level_outcome(s, [_run(False, goodput=0.1)], 1) is False  # over-saturated: no confirmation
    assert level_outcome(s, [_run(True), _run(False), _run(False)], 3) is None  # majority failed: confirm
    assert level_outcome(s, [_run(True), _run(False), _run(False), _run(False)], 3) is False
    no_confirm = s.model_copy(update={"confirm_failures": 0})
    assert level_outcome(no_confirm, [_run(False)], 1) is False
    assert level_outcome(no_confirm, [_run(True), _run(True), _run(False)], 3) is True


@pytest.mark.parametrize(
    ("search", "trials", "message"),
    [
        ({"var": "level", "start": 1000, "max": 512}, [{"name": "c{level}", "profile": "p"}],
         "x.yaml: search: start: must be in [min, max] = [1, 512], got 1000"),
        ({"var": "level", "start": 8, "max": 512}, [{"name": "c", "profile": "p"}],
         "x.yaml: trials.0.name: must hold {level} (one trial per level)"),
        (None, [{"name": "c{level}", "profile": "p"}],
         "x.yaml: search: analysis kind search needs a search section, and a search section needs it"),
    ],
)  # fmt: skip
def test_bad_search_sections(tmp_path: Path, capsys: pytest.CaptureFixture[str], search: Any, trials: Any,
                             message: str) -> None:  # fmt: skip
    profile = {"version": 1, "name": "p", "traffic": [{"name": "t"}],
               "stages": [{"name": "s", "users": "${level}", "duration": 1}]}  # fmt: skip
    doc: dict[str, Any] = {"version": 1, "name": "x", "profiles": {"p": profile}, "trials": trials,
                           "analysis": {"kind": "search"}}  # fmt: skip
    if search is not None:
        doc["search"] = search
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["experiment", str(path), "--results", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"loadlens experiment: error: {message}\n"
