"""What each user draws per request (exporters/serving/calibrate/user_draws.py): output lengths spread around
their mean and a think time after each answer, read from a sweep's trial parameters or a run's profile, drawn
again by the replay, taken out of the turnaround; and why the sweep has them: with one length, closed-loop
users move in lockstep and a stage's TTFT median falls between two modes (docs/calibration.md, *Why the loads
are drawn*). And :func:`replay_runs`, which reads a stage's replays as a trial's repeats are read."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from exporters.serving.calibrate.benchmark_runs import profile_draws
from exporters.serving.calibrate.client_overhead import stage_turnaround
from exporters.serving.calibrate.observations import CalibrationInputError, Stage, read_stages
from exporters.serving.calibrate.replay import StageLoad, replay, replay_runs, stage_load
from exporters.serving.calibrate.user_draws import NO_THINK, Clamped, output_length
from loadlens.contracts.engine_counters import SPAN
from loadlens.contracts.results import parse_result
from tests.calibrate.known import LOADS, experiment_doc, hidden_profile, model, observe
from tests.support.paths import ROOT


def _quantile(values: list[float], q: float) -> float:
    data = sorted(values)
    pos = (len(data) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def test_the_replay_draws_each_requests_length_around_the_mean(tmp_path: Path) -> None:
    gpu = hidden_profile(tmp_path)
    fixed = StageLoad(1, 240, 48, 8.0, warmup_s=0.5)
    spread = StageLoad(1, 240, 48, 8.0, warmup_s=0.5, output_stdev=12.0)
    a = replay(model(), gpu, fixed)
    b = replay(model(), gpu, spread)
    assert b.figures == replay(model(), gpu, spread).figures  # seeded: a replay repeats itself
    # The window's counters hold part of a request at each edge: a mean per request within one request's tokens
    # over the requests ended in the window. Without a spread every request asks the mean (the E2Es alike).
    done = a.counters["vllm:request_success_total"]
    assert abs(a.counters["vllm:generation_tokens_total"] / done - 48) <= 48 / done
    assert max(a.samples["e2el"]) - min(a.samples["e2el"]) < 2 * 2.3  # within two decode steps of the hidden sim
    # With one, the lengths differ (so do the requests' E2E) and average the mean within sampling error (4
    # standard errors of n draws of stdev 12) and the edge.
    e2e = b.samples["e2el"]
    assert max(e2e) - min(e2e) > 10 * 2.3
    n = b.counters["vllm:request_success_total"]
    assert abs(b.counters["vllm:generation_tokens_total"] / n - 48) < 4 * 12 / n**0.5 + 96 / n
    # One user has nobody to wait for: the TTFT is the lone prefill either way.
    assert b.figures["median_ttft_ms"] == pytest.approx(a.figures["median_ttft_ms"], rel=0.02)
    assert min(output_length(2, 50.0, random.Random(i)) for i in range(50)) == 1  # never below 1
    assert output_length(48, 0.0, random.Random(0)) == 48


def test_a_spread_breaks_the_lockstep_of_two_users(tmp_path: Path) -> None:
    """Two users, one length: the stage's TTFT has two modes (a lone prefill, and one behind the other user's)
    and its median falls in the gap between them; lengths spread by a third of the mean leave one mode, whose
    middle quantiles lie close together."""
    gpu = hidden_profile(tmp_path)
    fixed = replay(model(), gpu, StageLoad(2, 600, 48, 8.0, warmup_s=0.5), turnaround_s=0.001)
    spread = replay(model(), gpu, StageLoad(2, 600, 48, 8.0, warmup_s=0.5, output_stdev=16.0), turnaround_s=0.001)

    def middle(samples: list[float]) -> float:
        """The 40 %-60 % quantile range over the median."""
        return (_quantile(samples, 0.6) - _quantile(samples, 0.4)) / _quantile(samples, 0.5)

    assert middle(fixed.samples["ttft"]) > 0.3
    assert middle(spread.samples["ttft"]) < 0.05


def test_a_trials_draws_are_read_from_its_parameters(tmp_path: Path) -> None:
    observed = observe(hidden_profile(tmp_path), list(LOADS)[:2])
    doc = experiment_doc(observed)
    trials = doc["trials"]
    assert isinstance(trials, list)
    trials[0]["params"].update(output_stdev=16, think_s=0.1, think_stdev_s=0.05)
    path = tmp_path / "experiment_result.json"
    path.write_text(json.dumps(doc))
    first, second = read_stages(path)
    assert (first.output_stdev, first.think_time) == (16.0, Clamped(0.1, 0.05))
    assert (second.output_stdev, second.think_time) == (0.0, NO_THINK)  # a trial without them: none
    load = stage_load(first)
    # No benchmark_result.json beside it: no lead-in.
    want = StageLoad(1, 240, 48, first.duration_s, output_stdev=16.0, think_time=Clamped(0.1, 0.05),
                     server_span_s=first.counters[SPAN])  # fmt: skip
    assert load == want
    assert first.counters[SPAN] == observed[0].counters[SPAN]
    for key, unit in (("output_stdev", "tokens"), ("think_s", "seconds"), ("think_stdev_s", "seconds")):
        for bad in (-1, "wide", True):
            trials[0]["params"][key] = bad
            path.write_text(json.dumps(doc))
            with pytest.raises(CalibrationInputError) as err:
                read_stages(path)
            assert str(err.value) == f"{path}: trial c1-p240: {key!r} is {bad!r}, not a number of {unit} >= 0"
            trials[0]["params"][key] = 0


def test_a_clamped_normals_mean() -> None:
    """The mass below the low bound sits at it (and above the high one at that): Phi and phi of the bounds,
    against many draws."""
    assert Clamped(0.1, 0.1).expected() == pytest.approx(0.1 * 0.8413447 + 0.1 * 0.2419707, rel=1e-6)
    assert Clamped(0.25).expected() == 0.25 and Clamped(-1.0).expected() == 0.0
    assert NO_THINK.expected() == 0.0
    rng = random.Random(7)
    for dist in (Clamped(0.1, 0.1), Clamped(1.0, 2.0, 0.5, 2.0), Clamped(-0.2, 0.3)):
        draws = [dist.draw(rng) for _ in range(40_000)]
        assert min(draws) >= dist.low and max(draws) <= dist.high
        assert statistics.fmean(draws) == pytest.approx(dist.expected(), abs=4 * statistics.stdev(draws) / 200)
    assert math.isinf(Clamped(1.0).high)


def test_the_turnaround_leaves_the_asked_think_time_out(tmp_path: Path) -> None:
    """A hidden sim with no time outside the engine, its users thinking 0.1 ± 0.1 s: the cycle is E2E plus the
    clamped think mean (108 ms), and calibrate's turnaround, which takes that mean out, is near 0: within the
    think draws' own scatter (their mean over 250 requests has a standard error of 5 ms; 8 s of requests drew
    84 ms on this seed) and the window's edge (whole requests, a cycle in 250)."""
    gpu = hidden_profile(tmp_path)
    think = Clamped(0.1, 0.1)
    got = replay(model(), gpu, StageLoad(2, 240, 48, 30.0, warmup_s=0.5, think_time=think))
    figs = {k: v for k, v in got.figures.items() if v is not None}
    stage = Stage("c2", 2, 240.0, 48.0, 30.0, int(figs["completed"]), figs, got.counters, think_time=think)
    bare = Stage("c2", 2, 240.0, 48.0, 30.0, int(figs["completed"]), figs, got.counters)
    with_think, without = stage_turnaround(stage), stage_turnaround(bare)
    assert with_think is not None and without is not None
    assert without - with_think == pytest.approx(think.expected())
    assert abs(with_think) < 0.02
    base = replay(model(), gpu, StageLoad(2, 240, 48, 30.0, warmup_s=0.5)).figures
    assert figs["completed"] < (base["completed"] or 0)


def test_a_runs_profile_says_what_its_users_drew() -> None:
    doc = json.loads((ROOT / "tests" / "fixtures" / "results" / "mix" / "benchmark_result.json").read_text())
    assert profile_draws(parse_result(doc, "mix")) == {}  # two entries: no one draw stands for the stage
    doc["profile"]["traffic"] = [t for t in doc["profile"]["traffic"] if t["name"] == "sum"]
    one = profile_draws(parse_result(doc, "sum"))
    assert one == {"output_stdev": 8.0, "think_time": Clamped(0.25, 0.1, 0.0, 3600.0)}
    doc["profile"]["traffic"][0].update(output_tokens=None, think_time_s=None)  # a file from before these keys
    assert profile_draws(parse_result(doc, "old")) == {}


def test_replay_runs_reads_its_replays_as_a_trials_repeats(tmp_path: Path) -> None:
    gpu = hidden_profile(tmp_path)
    load = StageLoad(2, 240, 48, 4.0, warmup_s=0.5, output_stdev=12.0, think_time=Clamped(0.05, 0.05))
    one = [replay(model(), gpu, load, seed=i) for i in range(3)]
    assert one[0].figures != one[1].figures  # each run draws its own
    assert replay_runs(model(), gpu, load, 1).figures == one[0].figures
    got = replay_runs(model(), gpu, load, 3)
    for key in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "output_throughput"):
        assert got.figures[key] == pytest.approx(statistics.fmean(r.figures[key] or 0.0 for r in one))
    assert got.figures["completed"] == sum(r.figures["completed"] or 0.0 for r in one)
    assert got.samples["ttft"] == [v for r in one for v in r.samples["ttft"]]
    done = sum(r.counters["vllm:request_success_total"] for r in one)
    assert got.counters["vllm:request_success_total"] == done
    e2e = sum(r.counters["vllm:e2e_request_latency_seconds_sum"] for r in one)
    assert got.figures["server_mean_e2el_ms"] == pytest.approx(e2e / done * 1000)
