"""The stage as the load generator measured it (exporters/serving/calibrate/replay.py, observations.py): the
warmup before it with its own users, the users a stage adds starting at once, every request sent inside the stage
measured to its end, and the server's counters read over the span the sampler covered (docs/calibration.md,
*The stage as it was measured*)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from exporters.serving.calibrate.observations import LeadIn, lead_in_before, read_lead_in, read_stages
from exporters.serving.calibrate.replay import StageLoad, replay, stage_load
from exporters.serving.engines.sim.stats import EngineEvent, EngineStats, StepStats
from loadlens.contracts.engine_counters import SPAN
from tests.calibrate.known import experiment_doc, hidden_profile, model, observe


class _Steps:
    """Each planned step's (virtual time, context requests)."""

    def __init__(self, clock: object) -> None:
        self.clock = clock
        self.steps: list[tuple[float, int]] = []

    def record_step(self, step: StepStats) -> None:
        self.steps.append((self.clock(), step.counts[0]))  # type: ignore[operator]

    def record(self, stats: EngineStats) -> None:
        pass

    def record_event(self, event: EngineEvent) -> None:
        pass


def _replay_steps(tmp_path: Path, load: StageLoad) -> tuple[list[tuple[float, int]], dict[str, float | None]]:
    seen: list[_Steps] = []

    def loggers(clock: object) -> list[_Steps]:
        seen.append(_Steps(clock))
        return seen

    got = replay(model(), hidden_profile(tmp_path), load, loggers=loggers)
    return seen[0].steps, got.figures


def test_the_users_a_stage_adds_start_at_once_when_its_warmup_ends(tmp_path: Path) -> None:
    """Two users warm up for 1 s, then the stage has eight: the six added send at its start together, so one
    step admits all six (the other two are mid-answer, no think time); without a lead-in every step after the
    first admits at most two, as the eight users' loops drift apart only by their answers' lengths."""
    load = StageLoad(8, 240, 48, 2.0, warmup_s=1.0, lead_in_users=2)
    steps, _ = _replay_steps(tmp_path, load)
    start = steps[0][0]
    before = [n for t, n in steps if t < start + 1.0]
    assert max(before) <= 2  # the warmup: two users
    burst = next((t, n) for t, n in steps if n > 2)
    assert burst[1] == 6
    assert start + 1.0 <= burst[0] < start + 1.0 + 0.1


def test_a_stage_that_drops_users_stops_them_at_its_start(tmp_path: Path) -> None:
    """Three users warm up, the stage has one: after the stage's start no step carries more than one new
    request once the dropped users' last answers are done, and the stage measures only its own user's requests."""
    load = StageLoad(1, 240, 48, 2.0, warmup_s=1.0, lead_in_users=3)
    steps, figures = _replay_steps(tmp_path, load)
    start = steps[0][0]
    late = [n for t, n in steps if t >= start + 1.2]
    assert max(late) == 1
    alone = replay(model(), hidden_profile(tmp_path), StageLoad(1, 240, 48, 2.0, warmup_s=1.0))
    assert figures["completed"] == pytest.approx(alone.figures["completed"], abs=1)


def test_every_request_sent_inside_the_stage_is_measured_to_its_end(tmp_path: Path) -> None:
    """One user, no think time: the requests sent in the 2 s stage are counted, the one still running at its end
    included (the load generator lets it finish): as many as cycles fit in the stage, whole, and the output
    throughput is their tokens over the stage."""
    load = StageLoad(1, 240, 48, 2.0, warmup_s=0.5)
    got = replay(model(), hidden_profile(tmp_path), load)
    e2e = got.samples["e2el"]
    completed = got.figures["completed"]
    assert completed == len(e2e)
    assert got.figures["output_throughput"] == pytest.approx(completed * 48 / 2.0)
    cycle = sum(e2e) / len(e2e) / 1000
    assert completed in (math.floor(2.0 / cycle), math.ceil(2.0 / cycle))


def test_the_server_counters_cover_the_span_the_sampler_covered(tmp_path: Path) -> None:
    """A sampler reading /metrics every 5 s covers 15 s of a 20 s stage: the replay reads its own counters over
    15 s at a drawn offset, so the server figures leave out the same share of the stage (its start's burst
    included, as often as the sampler's phase leaves it out)."""
    load = StageLoad(4, 240, 48, 20.0, warmup_s=1.0, lead_in_users=2, server_span_s=15.0)
    got = replay(model(), hidden_profile(tmp_path), load)
    assert got.counters[SPAN] == pytest.approx(15.0)
    whole = replay(model(), hidden_profile(tmp_path), StageLoad(4, 240, 48, 20.0, warmup_s=1.0, lead_in_users=2))
    assert whole.counters[SPAN] == pytest.approx(20.0)


def _write_run(
    root: Path, rel: str, warmup_users: int, warmup_s: float, measured_first: bool = False,
    ended: str = "max_duration", source: str | None = None,
) -> None:  # fmt: skip
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    warmup = {"name": "warmup", "warmup": True, "target_users": warmup_users, "duration": warmup_s,
              "end_reason": ended}  # fmt: skip
    stage = {"name": "stage", "warmup": False, "target_users": 8, "duration": 20.0, "end_reason": "duration"}
    doc: dict[str, object] = {"stages": [stage] if measured_first else [warmup, stage]}
    if source is not None:
        doc["profile"] = {"name": "calibration-closed", "source": source}
    path.write_text(json.dumps(doc), encoding="utf-8")


def _write_profile(path: Path, until: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    stages = [{"name": "warmup", "warmup": True, "users": 2, "until_requests": until, "max_duration": 20},
              {"name": "stage", "users": 8, "duration": 20}]  # fmt: skip
    path.write_text(yaml.safe_dump({"version": 1, "name": "p", "stages": stages}), encoding="utf-8")


def test_a_lead_in_that_ended_on_its_count_is_read_with_it(tmp_path: Path) -> None:
    """A warmup ``until_requests: 4`` that ended on it: the count, from the run's profile where its source
    names it, or from the experiment's ``profiles/`` where the directory was copied elsewhere."""
    _write_profile(tmp_path / "profiles" / "c8.yaml", 4)
    runs = ["trials/c8/r1/benchmark_result.json", "trials/c8/r2/benchmark_result.json"]
    for rel in runs:
        _write_run(tmp_path, rel, 2, 2.0, ended="until_requests", source=str(tmp_path / "profiles" / "c8.yaml"))
    assert read_lead_in(tmp_path, runs) == LeadIn(2, 2.0, 4)
    for rel in runs:
        _write_run(tmp_path, rel, 2, 2.0, ended="until_requests", source="/elsewhere/profiles/c8.yaml")
    assert read_lead_in(tmp_path, runs) == LeadIn(2, 2.0, 4)
    _write_run(tmp_path, runs[1], 2, 2.0, ended="max_duration", source="/elsewhere/profiles/c8.yaml")
    assert read_lead_in(tmp_path, runs) == LeadIn(2, 2.0)  # one run ended on time: the duration
    _write_profile(tmp_path / "profiles" / "c8.yaml", "four")
    _write_run(tmp_path, runs[1], 2, 2.0, ended="until_requests", source="/elsewhere/profiles/c8.yaml")
    assert read_lead_in(tmp_path, runs) == LeadIn(2, 2.0)  # no usable count: the duration


def test_a_lead_in_that_ends_on_a_count_starts_the_stage_at_that_answer(tmp_path: Path) -> None:
    """Two users warm up until 4 answers, no think time: the stage starts as the 4th answer comes, so the six
    users it adds send together with the user that just had it, and the step after admits seven; the other
    lead-in user is mid-answer. A lead-in of a fixed time ends wherever the users are."""
    load = StageLoad(8, 240, 48, 2.0, warmup_s=30.0, lead_in_users=2, lead_in_requests=4)
    steps, _ = _replay_steps(tmp_path, load)
    burst = next(n for _, n in steps if n > 2)
    assert burst == 7
    start = steps[0][0]
    assert next(t for t, n in steps if n > 2) < start + 2.0  # four answers, not the 30 s cap


def test_the_lead_in_is_read_from_the_runs_results(tmp_path: Path) -> None:
    _write_run(tmp_path, "trials/c8/r1/benchmark_result.json", 2, 2.5)
    _write_run(tmp_path, "trials/c8/r2/benchmark_result.json", 2, 3.5)
    runs = ["trials/c8/r1/benchmark_result.json", "trials/c8/r2/benchmark_result.json"]
    assert read_lead_in(tmp_path, runs) == LeadIn(2, 3.0)
    assert read_lead_in(tmp_path, [*runs, "trials/c8/r3/benchmark_result.json"]) is None  # one missing: none
    _write_run(tmp_path, "trials/c1/r1/benchmark_result.json", 2, 2.0, measured_first=True)
    assert read_lead_in(tmp_path, ["trials/c1/r1/benchmark_result.json"]) is None  # nothing ran before it
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    assert read_lead_in(tmp_path, ["bad.json"]) is None


def test_a_sweeps_stage_replays_with_its_lead_in_and_its_span(tmp_path: Path) -> None:
    observed = observe(hidden_profile(tmp_path), ["c3-p240"])
    doc = experiment_doc(observed)
    trials = doc["trials"]
    assert isinstance(trials, list)
    for run in trials[0]["runs"]:
        _write_run(tmp_path, run["result_path"], 2, 1.5)
    path = tmp_path / "experiment_result.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    (stage,) = read_stages(path)
    assert stage.lead_in == LeadIn(2, 1.5)
    load = stage_load(stage)
    assert (load.lead_in_users, load.warmup_s) == (2, 1.5)
    assert load.server_span_s == pytest.approx(stage.counters[SPAN] / stage.runs)


def test_a_load_runs_stage_has_the_stage_before_it_as_its_lead_in(tmp_path: Path) -> None:
    """``loadlens load`` runs: each measured stage's lead-in is the stage before it, warm-up or measured, where
    that one ran closed-loop users; after an open-loop stage, or for the first stage, none."""
    _write_profile(tmp_path / "profiles" / "run.yaml", 4)
    doc = {
        "profile": {"source": str(tmp_path / "profiles" / "run.yaml")},
        "stages": [
            {"name": "warmup", "warmup": True, "target_users": 2, "duration": 1.8, "end_reason": "until_requests"},
            {"name": "c4", "target_users": 4, "duration": 20.0, "end_reason": "duration"},
            {"name": "burst", "target_users": None, "target_rate": 5.0, "duration": 10.0, "end_reason": "duration"},
            {"name": "c8", "target_users": 8, "duration": 20.0, "end_reason": "duration"},
        ],
    }
    assert [lead_in_before(tmp_path, doc, i) for i in range(4)] == [None, LeadIn(2, 1.8, 4), LeadIn(4, 20.0), None]
