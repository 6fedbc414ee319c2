"""The time outside vLLM the replay adds, in two parts (the client's E2E beyond vLLM's, and the user's
turnaround beyond the client's E2E): each ``fixed + per_user × users`` where the stages show a growth, else
their mean, with the reason; and the replay's draws around them, seeded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.serving.calibrate.client_overhead import fit_client_overhead, fit_line, stage_gap, stage_turnaround
from exporters.serving.calibrate.observations import Stage, read_stages
from exporters.serving.calibrate.replay import StageLoad, replay
from loadlens.contracts.gpu_profile import load_gpu_profile
from tests.calibrate.known import model


def stage(name: str, users: int, gap_s: float, turn_s: float = 0.0, server_e2e_s: float = 0.1) -> Stage:
    """A closed-loop stage of 10 s whose client mean E2E exceeds vLLM's by ``gap_s`` and whose users wait
    ``turn_s`` between an answer and the next request (so completed = users × 10 s / cycle)."""
    counters = {"vllm:e2e_request_latency_seconds_sum": server_e2e_s * 10, "vllm:e2e_request_latency_seconds_count": 10}
    client = server_e2e_s + gap_s
    completed = round(users * 10.0 / (client + turn_s))
    return Stage(name, users, 100.0, 10.0, 10.0, completed, {"mean_e2el_ms": client * 1000}, counters)


def test_both_parts_grow_with_users() -> None:
    stages = [stage(f"c{u}", u, 0.004 + 0.015 * u, 0.010 * u, server_e2e_s=0.25) for u in (1, 2, 4, 8)]
    got = fit_client_overhead(stages)
    assert got is not None and got.turnaround is not None
    assert got.outside.fixed_s == pytest.approx(0.004) and got.outside.per_user_s == pytest.approx(0.015)
    assert got.outside.at(4) == pytest.approx(0.064)
    assert got.outside.note.startswith("4 ms + 15 ms per user (± ")
    assert got.outside.note.endswith("), fitted over the stages")
    assert got.outside.points["c8"][0] == 8 and got.outside.points["c8"][1] == pytest.approx(0.124)
    # completed is a whole number of requests, so the turnaround is read to within a request's share
    assert got.turnaround.per_user_s == pytest.approx(0.010, abs=0.0005)
    for s in stages:
        turn = stage_turnaround(s)
        assert turn == pytest.approx(s.users * s.duration_s / s.completed - s.figures["mean_e2el_ms"] / 1000)


def test_a_constant_where_the_data_show_no_growth() -> None:
    got = fit_line({"a": (1, 0.03), "b": (2, 0.01), "c": (4, 0.02)})
    assert got is not None and got.per_user_s == 0.0 and got.fixed_s == pytest.approx(0.02)
    assert got.note == "constant, the mean over the fitted stages: no growth with users in the data (-2.14 ms per user)"
    two = fit_line({"a": (1, 0.03), "b": (2, 0.01)})
    assert two is not None and two.note.endswith("2 stages, 2 numbers of users (a growth needs 3 and 2)")
    same = fit_line({"a": (2, 0.01), "b": (2, 0.02), "c": (2, 0.03)})
    assert same is not None and same.note.endswith("3 stages, 1 numbers of users (a growth needs 3 and 2)")
    noisy = fit_line({"a": (1, 0.01), "b": (2, 0.05), "c": (3, 0.0), "d": (4, 0.04)})
    assert noisy is not None and "its growth with users not determined (" in noisy.note
    asked = fit_line({f"c{u}": (u, 0.015 * u) for u in (1, 2, 4)}, constant=True)
    assert asked is not None and asked.note.endswith(": --constant-client-overhead")
    assert asked.at(100) == pytest.approx(0.035)


def test_never_below_zero_and_none_without_data() -> None:
    got = fit_line({f"c{u}": (u, -0.01 + 0.01 * u) for u in (1, 2, 3)})
    assert got is not None and got.at(0) == 0.0 and got.at(1) == pytest.approx(0.0, abs=1e-12)
    bare = Stage("x", 1, 100.0, 10.0, 10.0, 50)
    assert stage_gap(bare) is None and stage_turnaround(bare) is None and fit_client_overhead([bare]) is None
    assert fit_line({}) is None


def test_the_replay_draws_each_part_around_its_mean_and_repeats_itself() -> None:
    """The draws break the lockstep of closed-loop users (docs/calibration.md, *Client overhead*): their mean is
    the modeled one, and a replay is deterministic (a seeded generator)."""
    load = StageLoad(3, 240, 24, 8.0, warmup_s=0.5)
    gpu = load_gpu_profile("h100-sxm")
    base = replay(model(), gpu, load).figures
    a = replay(model(), gpu, load, client_overhead_s=0.004, turnaround_s=0.006)
    assert a.figures == replay(model(), gpu, load, client_overhead_s=0.004, turnaround_s=0.006).figures
    f = {k: v for k, v in a.figures.items() if v is not None}
    # The client's E2E holds the outside part (mean 4 ms): its mean is the server's plus about that.
    assert f["mean_e2el_ms"] - f["server_mean_e2el_ms"] == pytest.approx(4.0, rel=0.25)
    # Fewer requests complete than without the time outside: the cycle holds both parts.
    assert f["completed"] < (base["completed"] or 0)
    assert f["p99_ttft_ms"] > f["median_ttft_ms"]  # the drawn outside part spreads the client's TTFT


@pytest.mark.parametrize("repeats", [2, 3])
def test_a_stage_read_from_repeats_has_one_runs_turnaround_and_server_figures(tmp_path: Path, repeats: int) -> None:
    """A trial run ``repeats`` times with identical runs reads as one run does: its requests and counters are
    summed over the runs, its duration is one run's, and what calibrate fits from them is per run."""
    from tests.calibrate.known import LOADS, experiment_doc, hidden_profile, observe

    names = list(LOADS)[:2]
    observed = observe(hidden_profile(tmp_path), names)
    read = {}
    for n in (1, repeats):
        path = tmp_path / f"experiment_result-{n}.json"
        path.write_text(json.dumps(experiment_doc(observed, repeats=n)))
        read[n] = read_stages(path)
    for one, many in zip(read[1], read[repeats], strict=True):
        assert (one.runs, many.runs) == (1, repeats)
        assert many.completed == repeats * one.completed
        assert many.duration_s == one.duration_s
        assert stage_turnaround(many) == pytest.approx(stage_turnaround(one), rel=1e-12)
        assert stage_gap(many) == pytest.approx(stage_gap(one), rel=1e-12)
        assert many.server_figures() == pytest.approx(one.server_figures(), rel=1e-12)
        assert (many.prompt_tokens, many.output_tokens) == pytest.approx((one.prompt_tokens, one.output_tokens))
