"""SearchRunner without processes: a stand-in for `loadlens load` whose goodput falls off above a known
capacity. The search measures each level once, ends on the capacity, and --resume after an interrupt
replays the plan, reusing every level already measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadlens.contracts.experiment_result import ExperimentResult, TrialRun, parse_experiment_result
from loadlens.contracts.slo import load_slos
from loadlens.experiment.analysis.analyse import analyse
from loadlens.experiment.models import PlannedTrial, expand_trials, load_experiment
from loadlens.experiment.runner import Interrupted, RunOptions
from loadlens.experiment.search import SearchRunner
from loadlens.experiment.servers import ServerControl

CAPACITY = 37


class FakeServer(ServerControl):
    def prepare(self, trial: PlannedTrial) -> str:
        return "http://fake"


class FakeRunner(SearchRunner):
    def __init__(
        self, *args: Any, interrupt_after: int | None = None, stalls: frozenset[int] = frozenset(), **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.measured: list[int] = []
        self.interrupt_after = interrupt_after
        self.stalls = stalls
        """Levels whose first run fails below the capacity (a stalled host), as the packaged search must survive."""

    def _run_load(self, trial: PlannedTrial, url: str, repeat: int) -> TrialRun:
        if self.interrupt_after is not None and len(self.measured) == self.interrupt_after:
            raise Interrupted
        level = int(trial.vars["level"])
        ok = level <= CAPACITY and not (level in self.stalls and level not in self.measured)
        self.measured.append(level)
        return TrialRun(
            repeat=repeat, run_id=f"r{repeat}", result_path="x", log_path="y", exit_code=0, completed=True,
            start_timestamp=float(len(self.measured)), end_timestamp=0.0, duration_s=0.0,
            figures={"goodput_ratio": 0.95 if ok else 0.5}, verdict_status="pass" if ok else "fail",
        )  # fmt: skip


def runner(tmp_path: Path, resume: bool, confirm: int = 0, **kwargs: Any) -> FakeRunner:
    exp = load_experiment("slo-search")
    assert exp.spec.search is not None
    exp.spec.search.confirm_failures = confirm
    opts = RunOptions(directory=tmp_path, run_id="s", repeats=1, resume=resume)
    spec = exp.spec
    r = FakeRunner(exp, expand_trials(exp), FakeServer(None), opts,
                   analyse=analyse(spec.analysis, load_slos(), spec.search), say=lambda _: None, **kwargs)  # fmt: skip
    r.profiles = {}
    r.result = None
    return r


def prepare_without_dry_run(r: FakeRunner, tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir(exist_ok=True)
    if r.opts.resume:
        r.result = parse_experiment_result(json.loads((tmp_path / "experiment_result.json").read_text()))


def test_search_ends_on_the_capacity_and_resume_reuses_levels(tmp_path: Path) -> None:
    first = runner(tmp_path, resume=False, interrupt_after=4)
    prepare_without_dry_run(first, tmp_path)
    with pytest.raises(Interrupted):
        first.run()
    assert first.measured == [8, 16, 32, 64]
    second = runner(tmp_path, resume=True)
    prepare_without_dry_run(second, tmp_path)
    result: ExperimentResult = second.run()
    assert second.measured == [48, 40, 36, 38, 37]  # the first four were not run again
    assert result.completed
    assert [t.name for t in result.trials] == ["c8", "c16", "c32", "c64", "c48", "c40", "c36", "c38", "c37"]
    assert result.tables[1].rows[0]["capacity"] == 37.0 and result.tables[1].rows[0]["next_failing"] == 38.0
    assert [r["level"] for r in result.tables[0].rows] == [8, 16, 32, 36, 37, 38, 40, 48, 64]
    written = json.loads((tmp_path / "experiment_result.json").read_text())
    assert written["trials"][0]["runs"][0]["start_timestamp"] == 1.0  # kept from before the interrupt


def test_a_stalled_run_below_the_capacity_does_not_end_the_search_low(tmp_path: Path) -> None:
    r = runner(tmp_path, resume=False, confirm=1, stalls=frozenset({16}))
    prepare_without_dry_run(r, tmp_path)
    result = r.run()
    # 16 failed once and passed its confirmation, so the search went on up; 64, 48, 40 and 38 failed twice.
    assert r.measured == [8, 16, 16, 32, 64, 64, 48, 48, 40, 40, 36, 38, 38, 37]
    assert result.tables[1].rows[0]["capacity"] == 37.0
    sixteen = next(row for row in result.tables[0].rows if row["level"] == 16)
    assert sixteen["passed"] == "1/2" and sixteen["level_passes"] is True


def test_without_confirmation_one_stalled_run_ends_the_search_low(tmp_path: Path) -> None:
    r = runner(tmp_path, resume=False, stalls=frozenset({16}))
    prepare_without_dry_run(r, tmp_path)
    result = r.run()
    assert r.measured == [8, 16, 12, 14, 15]
    assert result.tables[1].rows[0]["capacity"] == 15.0
