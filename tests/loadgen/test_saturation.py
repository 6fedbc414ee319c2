"""The over-saturation test (loadgen/saturation.py) on series with known answers, and its wiring: the store's
timelines, the live check and --stop-on-oversaturation in the local role, the result block, the summary, the
/metrics gauge."""

from __future__ import annotations

import json
import math
import random
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import configargparse
import pytest
from prometheus_client import CollectorRegistry

from benchmarks.saturation import first_detection, judge_at, queue_sim
from loadgen.dispatch import OpenLoopSchedule
from loadgen.metrics import LiveState, LoadgenCollector
from loadgen.options import add_locust_arguments
from loadgen.profile import load_profile
from loadgen.record import RequestRecord
from loadgen.roles import LocalRole
from loadgen.saturation import (
    NOT_JUDGED,
    OVER_SATURATED,
    STABLE,
    Series,
    Watch,
    coarsen,
    due_arrivals,
    judge,
    judge_stage,
    mann_kendall,
    result_block,
    theil_sen,
)
from loadgen.stage_clock import DRAIN
from loadgen.store import Store
from loadgen.summary import stage_table
from loadlens.contracts import results as R
from loadlens.contracts.slo import load_slos
from tests.loadgen.conftest import write_profile
from tests.support.paths import ROOT

BOUNDS = {m: (0.1, 1.0) for m in ("ttft", "itl", "chunk_itl", "tpot", "e2el", "dispatch_lag")}


def per_second(f: Any, duration: int, rng: random.Random, sd: float) -> Series:
    return [(s + 0.5, max(0.0, f(s + 0.5) + rng.gauss(0.0, sd))) for s in range(duration)]


# --- the statistics ---------------------------------------------------------------------------------------


def test_mann_kendall_s_and_z_by_hand() -> None:
    s, z = mann_kendall([1, 2, 3, 4, 5])
    assert s == 10 and z == pytest.approx(9 / math.sqrt(5 * 4 * 15 / 18))  # continuity-corrected
    s, z = mann_kendall([1, 1, 2])  # one tie of two: Var = (3*2*11 - 2*1*9) / 18
    assert s == 2 and z == pytest.approx(1 / math.sqrt(48 / 18))
    assert mann_kendall([3, 2, 1])[0] == -3 and mann_kendall([2, 2, 2]) == (0, 0.0)


def test_theil_sen_is_the_median_pairwise_slope_and_coarsen_averages() -> None:
    assert theil_sen([(0, 0), (1, 1), (2, 10)]) == 5.0  # slopes 1, 5, 9
    assert theil_sen([(0, 1), (1, 3), (2, 5), (3, 7), (4, 100)]) == 2.0  # one outlier leaves the slope alone
    assert coarsen([(float(i), float(i)) for i in range(5)], 2) == [(1.0, 1.0), (3.5, 3.5)]


# --- known answers ------------------------------------------------------------------------------------------


def test_a_stable_noisy_server_is_never_judged_over_saturated() -> None:
    """iid noise around a level, 60 s, 50 seeds: never over-saturated, live or at the end."""
    for seed in range(50):
        rng = random.Random(seed)
        ttft = per_second(lambda t: 0.2, 60, rng, 0.06)
        queue = per_second(lambda t: 20.0, 60, rng, 5.0)
        assert first_detection("open", ttft, queue, 60) is None, seed
        assert judge_at("open", ttft, queue, 60).verdict == STABLE, seed


def test_linear_growth_is_detected_at_the_expected_check() -> None:
    """TTFT and the queue grow from the start: the window is long enough at 15 s (10 % settle: 13.5 s), the
    second consecutive hit comes at 20 s."""
    rng = random.Random(1)
    ttft = per_second(lambda t: 0.1 + 0.2 * t, 60, rng, 0.05)
    queue = per_second(lambda t: 5.0 + 3.0 * t, 60, rng, 2.0)
    assert judge_at("open", ttft, queue, 10).verdict == NOT_JUDGED  # a 9 s window
    assert judge_at("open", ttft, queue, 15).verdict == OVER_SATURATED
    assert first_detection("open", ttft, queue, 60) == 20.0
    final = judge_at("open", ttft, queue, 60)
    assert final.over_saturated and final.latency is not None and final.load is not None
    assert final.latency.slope_per_s == pytest.approx(0.2, rel=0.05)
    assert final.load.slope_per_s == pytest.approx(3.0, rel=0.05)
    assert final.latency.p_value < 1e-9 and final.load.p_value < 1e-9
    assert final.reason.startswith("TTFT rose 10.") and "outstanding requests rose 159 " in final.reason


def test_a_step_that_levels_off_is_stable_and_a_capacity_drop_is_detected_after_it() -> None:
    rng = random.Random(2)
    # The server slows at 8 s and keeps up: TTFT and the queue (Little's law) step up, then stay.
    ttft = per_second(lambda t: 0.2 if t < 8 else 0.5, 60, rng, 0.05)
    queue = per_second(lambda t: 20.0 if t < 8 else 50.0, 60, rng, 4.0)
    end = judge_at("open", ttft, queue, 60)
    assert end.verdict == STABLE, end.reason
    # Its capacity falls below the arrival rate at 30 s: the queue and TTFT grow from there.
    ttft = per_second(lambda t: 0.2 + max(0.0, t - 30) * 0.3, 60, rng, 0.05)
    queue = per_second(lambda t: 20.0 + max(0.0, t - 30) * 4.0, 60, rng, 4.0)
    assert not judge_at("open", ttft, queue, 30).over_saturated
    found = first_detection("open", ttft, queue, 60)
    assert found is not None and 30 < found <= 50


def test_short_or_empty_stages_are_not_judged() -> None:
    rng = random.Random(3)
    ttft = per_second(lambda t: 0.1 + t, 8, rng, 0.0)
    j = judge_at("open", ttft, ttft, 8)
    assert (j.verdict, j.reason) == (NOT_JUDGED, "window of 7.2 s; the test needs at least 10 s")
    j = judge("open", ttft, [(1.0, 1.0)] * 20, window=(0.0, 30.0))
    assert j.reason == "ttft_seconds: 8 seconds with data; the test needs at least 10"


def test_closed_loop_needs_falling_throughput_as_well() -> None:
    """Fixed users: TTFT can only keep growing when throughput falls (users = throughput x latency). TTFT
    rising while users are still spawning, with throughput rising too, is not over-saturation."""
    rng = random.Random(4)
    ttft = per_second(lambda t: 0.2 + 0.05 * t, 60, rng, 0.05)
    falling = per_second(lambda t: 1000.0 - 10.0 * t, 60, rng, 30.0)
    rising = per_second(lambda t: 400.0 + 10.0 * t, 60, rng, 30.0)
    over = judge_at("closed", ttft, falling, 60)
    assert over.verdict == OVER_SATURATED and over.load is not None and over.load.direction == "decrease"
    assert "output tokens/s fell" in over.reason
    assert judge_at("closed", ttft, rising, 60).reason.startswith("output tokens/s show no significant fall")


def test_a_queueing_server_below_capacity_is_stable_and_at_twice_capacity_detected_within_25_s() -> None:
    """benchmarks/saturation.py's FCFS server, 8 sequences of 0.5-1.5 s (8 req/s): at 4 req/s never
    over-saturated (20 seeds); at 16 req/s always, within 25 s of a 60 s stage."""
    for seed in range(20):
        ttft, held = queue_sim(4.0, 60, seed)
        assert first_detection("open", ttft, held, 60) is None, seed
        assert not judge_at("open", ttft, held, 60).over_saturated, seed
        ttft, held = queue_sim(16.0, 60, seed)
        found = first_detection("open", ttft, held, 60)
        assert found is not None and found <= 25, seed
        assert judge_at("open", ttft, held, 60).over_saturated, seed


# --- the backlog -----------------------------------------------------------------------------------------


def test_due_arrivals_counts_without_advancing_the_schedule() -> None:
    constant = OpenLoopSchedule(10.0, "constant", 100.0, random.Random(0))
    assert due_arrivals(constant, 99.0) == 0 and due_arrivals(constant, 100.45) == 5
    poisson = OpenLoopSchedule(50.0, "poisson", 0.0, random.Random(7))
    due = due_arrivals(poisson, 2.0)
    taken = []
    while poisson.next_at <= 2.0:
        taken.append(poisson.take())
    assert due == len(taken) > 60  # the same draws the senders then take
    rows = SimpleNamespace(rows=[0.0, 1.0, 2.0, 3.0], pos=1, start=10.0, trace=SimpleNamespace(offset=float))
    rows.next_at = 11.0
    assert due_arrivals(rows, 12.5) == 2 and due_arrivals(None, 1e9) == 0


# --- the store -----------------------------------------------------------------------------------------------


def test_timelines_date_first_tokens_and_add_across_processes() -> None:
    a, b = Store(BOUNDS), Store(BOUNDS)
    interactive = load_slos(None).classes[0]
    a.record(RequestRecord(ttft=0.5, e2e=2.0, output_tokens=3), ("s", interactive.name, "m"), interactive, now=1001.9)
    a.record(RequestRecord(ttft=0.3, e2e=0.4), ("s", interactive.name, "m"), interactive, now=1000.5)
    a.record(RequestRecord(outcome="server_error"), ("s", interactive.name, "m"), interactive, now=1000.5)
    assert a.timelines["s"].ttft == {1000: [0.8, 2.0]}  # first tokens at 1000.4 and 1000.4
    a.queue_sample("s", 1000, 7)
    b.queue_sample("s", 1000, 5)
    b.queue_sample("s", 1001, 6)
    merged = Store.from_wire(BOUNDS, json.loads(json.dumps(a.take_delta())))
    merged.merge(Store.from_wire(BOUNDS, b.take_delta()))
    assert merged.timelines["s"].queue == {1000: [12.0, 2.0], 1001: [6.0, 1.0]}
    assert a.timelines == {} and b.timelines == {}


def test_judge_stage_reads_the_store_and_scales_a_missing_process_sample() -> None:
    """Two processes; one missed second 12: that second counts the other's sample twice, so one gap in the
    samples does not look like a drop in the queue."""
    store = Store(BOUNDS)
    stage = next(s for s in load_profile("open-loop").stages if s.open_loop)
    start = 1000.0
    for s in range(40):
        for proc in range(2):
            if not (s == 12 and proc == 1):
                store.queue_sample(stage.name, 1000 + s, 10 + 2 * s)
        store.timeline(stage.name).ttft[1000 + s] = [0.1 + 0.1 * s, 1.0]
    j = judge_stage(store, stage, start=start, end=start + 40)
    assert j.over_saturated and j.load is not None and j.load.slope_per_s == pytest.approx(4.0)
    assert (j.window_start_s, j.window_end_s) == (4.0, 40.0)


# --- the wiring -----------------------------------------------------------------------------------------------

PROFILE: dict[str, Any] = {
    "seed": 5,
    "traffic": [{"name": "chat", "weight": 1, "prompt": {"tokens": 8}, "output_tokens": 4}],
    "stages": [
        {"name": "low", "rate": 2, "arrival": "constant", "max_concurrency": 16, "duration": 60},
        {"name": "high", "rate": 50, "arrival": "constant", "max_concurrency": 16, "duration": 60},
        {"name": "after", "users": 2, "duration": 60},
    ],
}


def local_role(tmp_path: Path, *argv: str) -> LocalRole:
    profile = write_profile(tmp_path / "p.yaml", PROFILE)
    parser = configargparse.ArgumentParser()
    add_locust_arguments(parser)
    opts = parser.parse_args(
        ["--load-profile", str(profile), "--results", str(tmp_path / "results"), "--model", "m", *argv]
    )
    runner = SimpleNamespace(user_count=0, stats=SimpleNamespace(reset_all=lambda: None), worker_count=0)
    env = SimpleNamespace(parsed_options=opts, host="http://127.0.0.1:9", runner=runner, process_exit_code=None)
    return LocalRole(env, report_interval=3.0, locust_version="9.9")  # type: ignore[arg-type]


def grow(role: LocalRole, stage: str, start: float, seconds: int) -> None:
    """A stage whose queue and TTFT grow by the second since ``start``."""
    for s in range(seconds):
        role.store.queue_sample(stage, int(start) + s, 5 + 3 * s)
        role.store.timeline(stage).ttft[int(start) + s] = [0.1 + 0.2 * s, 1.0]


def test_stop_on_oversaturation_ends_the_run_and_every_output_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    role = local_role(tmp_path, "--run-id", "r", "--stop-on-oversaturation")
    role.saturation = Watch(interval=0.0)  # check at every tick
    role.tick()
    role.clock.window_start -= 60.0  # low ran its minute, at a level queue and TTFT
    low = role.clock.window_start
    for s in range(60):
        role.store.queue_sample("low", int(low) + s, 4)
        role.store.timeline("low").ttft[int(low) + s] = [0.1, 1.0]
    role.tick()
    assert role.clock.stage.name == "high"
    role.clock.window_start -= 30.0
    grow(role, "high", role.clock.window_start, 30)
    assert role.tick() == (16, 100.0)  # the first hit: not yet confirmed
    assert role.tick() is None  # the second: the run stops (no user is left to wait for)
    ends = [(w.spec.name, w.end_reason) for w in role.clock.windows]
    assert ends == [("low", "duration"), ("high", "over_saturated")]
    assert role.recorder.window == DRAIN and role.finished and role.live.over_saturated == {"high"}
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        r"loadgen: stage high is over-saturated at 30s: TTFT rose [45]\.\d\d s over 2[5-7] s \(p=\S+\) and "
        r"outstanding requests rose [67]\d \(p=\S+\)",
        out[-2],
    ), out[-2]
    assert out[-1] == (
        "loadgen: stopping the run (--stop-on-oversaturation): stage high is over-saturated; letting in-flight "
        "requests finish"
    )
    registry = CollectorRegistry()
    LoadgenCollector(role.live, registry=registry)
    assert registry.get_sample_value("loadlens_loadgen_over_saturated", {"stage": "high"}) == 1
    assert registry.get_sample_value("loadlens_loadgen_over_saturated", {"stage": "low"}) == 0

    role.on_test_stop(role.env)
    doc = json.loads((tmp_path / "results" / "r" / "benchmark_result.json").read_text())
    result = R.parse_result(doc)  # the typed model accepts the block
    low_sat, high_sat = (s.saturation for s in result.stages)
    assert low_sat is not None and high_sat is not None
    assert (low_sat.verdict, low_sat.detected_at_s, low_sat.mode) == ("stable", None, "open")
    assert high_sat.verdict == "over_saturated" and high_sat.detected_at_s == pytest.approx(30.0, abs=0.5)
    assert high_sat.latency is not None and high_sat.latency.series == "ttft_seconds"
    assert high_sat.load is not None and high_sat.load.series == "outstanding_requests"
    assert doc["overall"]["over_saturated_stages"] == ["high"] and doc["run"]["completed"] is False
    table = stage_table(doc).splitlines()
    assert table[0].endswith(" goodput % over-sat.")
    assert [line.split()[-1] for line in table[2:5]] == ["no", "YES", "YES"]  # low, high, overall
    assert table[-1].startswith("OVER-SATURATED: high (found at 30 s; ended the run): TTFT rose ")


def test_without_the_flag_the_stage_runs_on_and_is_reported(tmp_path: Path) -> None:
    role = local_role(tmp_path, "--run-id", "r")
    role.saturation = Watch(interval=0.0)
    role.tick()
    role.clock.window_start -= 60.0
    role.tick()
    role.clock.window_start -= 30.0
    grow(role, "high", role.clock.window_start, 30)
    role.tick()
    role.tick()
    assert role.clock.stage.name == "high" and not role.clock.draining and role.live.over_saturated == {"high"}


def test_the_result_block_and_the_docs_name_every_key() -> None:
    block = result_block(judge("open", [], [], window=(0.0, 3.0)), None)
    assert block == {
        "verdict": "not_judged", "reason": "window of 3.0 s; the test needs at least 10 s", "mode": "open",
        "alpha": 0.01, "window_start_s": 0.0, "window_end_s": 3.0, "detected_at_s": None, "latency": None,
        "load": None,
    }  # fmt: skip
    R.StageSaturation.model_validate(block)
    text = (ROOT / "docs" / "loadgen.md").read_text()
    keys = {*R.StageSaturation.model_fields, *R.SaturationTrend.model_fields, "over_saturated_stages"}
    assert sorted(k for k in keys if f"`{k}`" not in text) == []
    for name in ("loadlens_loadgen_over_saturated", "--stop-on-oversaturation", "STOP_ON_OVERSATURATION"):
        assert name in text


def test_live_check_timing() -> None:
    """Due every interval; a stage found once is not judged again."""
    store = Store(BOUNDS)
    stage = next(s for s in load_profile("open-loop").stages if s.open_loop)
    start = time.time() - 30
    for s in range(30):
        store.queue_sample(stage.name, int(start) + s, 5 + 3 * s)
        store.timeline(stage.name).ttft[int(start) + s] = [0.1 + 0.2 * s, 1.0]
    watch = Watch(interval=5.0)
    now = start + 30
    assert watch.check(store, stage, start=start, now=now) is None  # first hit
    assert watch.check(store, stage, start=start, now=now + 1) is None  # not due
    assert watch.check(store, stage, start=start, now=now + 5) is not None
    assert watch.detected == {stage.name: 35.0}
    assert watch.check(store, stage, start=start, now=now + 10) is None
    live = LiveState(profile="p", version="v", locust_version="l", stages=[stage.name], store=store)
    assert live.over_saturated == set()
