"""Experiment files: every packaged one loads and expands; every mistake is refused before anything starts,
naming the file and the field (CLI exit 2, one line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.cli import main
from loadlens.experiment.models import (
    ExperimentError,
    available_experiments,
    expand_trials,
    load_experiment,
    parse_experiment,
    substitute,
)
from loadlens.experiment.training.spec import training_names

PROFILE: dict[str, Any] = {
    "version": 1,
    "name": "p",
    "traffic": [{"name": "t", "priority": "${prio}"}],
    "stages": [{"name": "s", "users": 1, "duration": 1}],
}


def doc(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "version": 1,
        "name": "x",
        "parameters": {"knob": "batching_window_us", "ws": [1, 2]},
        "profiles": {"p": PROFILE},
        "trials": [{"name": "w{w}", "profile": "p", "sweep": {"w": {"knob": "{knob}", "values": "${ws}"}}}],
        "analysis": {"kind": "table"},
    }
    base.update(changes)
    return base


def parse(tmp_path: Path, d: dict[str, Any]) -> Any:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(d))
    return parse_experiment(d, path)


def test_packaged_experiments_load_and_expand() -> None:
    assert available_experiments() == [
        "batching-window",
        "burst-capacity",
        "calibration-sweep",
        "fairness",
        "hot-swap",
        "lora-rank",
        "multi-lora",
        "seed-benchmark",
        "slo-search",
        "token-budget",
    ]
    names = {n: [t.name for t in expand_trials(load_experiment(n))] for n in available_experiments()}
    assert names["batching-window"] == ["w1000", "w3000", "w10000", "w30000", "w100000", "w300000", "w1000000"]
    assert names["fairness"] == ["fcfs", "priority"]
    assert names["token-budget"] == ["s16-t64", "s16-t512", "s16-t4096", "s64-t64", "s64-t512", "s64-t4096"]
    assert names["seed-benchmark"] == ["default", "half-kv"]
    assert names["burst-capacity"] == ["b8", "b16", "b32", "b64", "b128", "b256"]
    assert names["calibration-sweep"] == ["c1-p128", "c2-p128", "c4-p128", "c8-p128", "p32-c2", "p192-c2", "p448-c2"]
    assert names["slo-search"] == ["c8"]  # the first level; the search plans the rest
    assert names["hot-swap"] == ["scheduled", "on-demand"]
    assert names["multi-lora"] == ["1-adapter", "3-adapters"]


def test_sweep_fills_knob_names_values_and_names_from_parameters(tmp_path: Path) -> None:
    exp = parse(tmp_path, doc()).with_parameters({"knob": "my_window", "ws": "10,25"})
    trials = expand_trials(exp)
    assert [(t.name, t.knobs, t.params) for t in trials] == [
        ("w10", {"my_window": 10}, {"w": 10}),
        ("w25", {"my_window": 25}, {"w": 25}),
    ]


def test_grid_is_the_cartesian_product_first_axis_slowest(tmp_path: Path) -> None:
    trials = [{"name": "s{a}-t{b}", "profile": "p", "sweep": {"a": [1, 2], "b": [3, 4]}, "vars": {"prio": 0}}]
    out = expand_trials(parse(tmp_path, doc(trials=trials)))
    assert [t.name for t in out] == ["s1-t3", "s1-t4", "s2-t3", "s2-t4"]
    assert out[1].knobs == {"a": 1, "b": 4}


def test_profile_variables_are_typed() -> None:
    assert substitute(PROFILE, {"prio": 10})["traffic"] == [{"name": "t", "priority": 10}]
    with pytest.raises(ExperimentError) as err:
        substitute(PROFILE, {})
    assert str(err.value) == "profile variable ${prio} has no value (trial vars: [])"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"version": 2}, "exp.yaml: version: Input should be 1"),
        ({"name": "bad name"}, "exp.yaml: name: must match ^[A-Za-z0-9][A-Za-z0-9_.=-]{0,62}$, got 'bad name'"),
        ({"repeats": 0}, "exp.yaml: repeats: Input should be greater than or equal to 1"),
        ({"trials": []}, "exp.yaml: trials: List should have at least 1 item after validation, not 0"),
        ({"trials": [{"name": "a", "profile": "nope"}]}, "exp.yaml: trials.0.profile: no profile 'nope' (have ['p'])"),
        (
            {"trials": [{"name": "a", "profile": "p", "sweep": {"w": {"values": [1]}}}]},
            "exp.yaml: trials.0.sweep.w: give exactly one of knob, var",
        ),
        (
            {"trials": [{"name": "a", "profile": "p", "sweep": {"w": [1, 2]}}]},
            "exp.yaml: trials: duplicate trial names ['a'] (put the swept labels in the name)",
        ),
        (
            {"trials": [{"name": "a/{w}", "profile": "p", "sweep": {"w": [1]}}]},
            "exp.yaml: trials.0.name: 'a/1' is not a safe directory name (^[A-Za-z0-9][A-Za-z0-9_.=-]{0,62}$)",
        ),
        (
            {"trials": [{"name": "{nope}", "profile": "p"}]},
            "exp.yaml: trials.0.name: cannot fill '{nope}': unknown field 'nope'",
        ),
        ({"analysis": {"kind": "u_curve", "x": "z"}}, "exp.yaml: analysis.x: must name a sweep axis (['w']), got 'z'"),
        (
            {"analysis": {"kind": "magic"}},
            "exp.yaml: analysis.kind: Input should be 'table', 'u_curve', 'fairness', 'token_budget', 'burst',"
            " 'search', 'hot_swap', 'lora_rank' or 'multi_lora'",
        ),
        ({"extra": 1}, "exp.yaml: extra: Extra inputs are not permitted"),
        ({"sample_interval": 0}, "exp.yaml: sample_interval: Input should be greater than or equal to 0.05"),
    ],
)
def test_mistakes_name_the_field(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ExperimentError) as err:
        parse(tmp_path, doc(**changes))
    assert str(err.value) == message


def test_cli_rejects_a_broken_file_with_exit_2_and_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(doc(repeats="many")))
    assert main(["experiment", str(path), "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    reason = "repeats: Input should be a valid integer, unable to parse string as an integer"
    assert err == f"loadlens experiment: error: broken.yaml: {reason}\n"
    assert not (tmp_path / "experiments").exists()  # nothing started, nothing written


def test_cli_rejects_a_bad_profile_inside_the_experiment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = {**PROFILE, "stages": [{"name": "s", "users": 0, "duration": 1}]}
    path = tmp_path / "badprof.yaml"
    path.write_text(
        yaml.safe_dump(doc(profiles={"p": bad}, trials=[{"name": "a", "profile": "p", "vars": {"prio": 0}}]))
    )
    assert main(["experiment", str(path), "--results", str(tmp_path), "--host", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("loadlens experiment: error: badprof.yaml: profiles.p: profile ")
    # the profile as loadlens load gets it: the experiment's warmup stage is stages[0]
    assert err[0].endswith(": stages[1].users: must be >= 1, got 0")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fairness", "--param", "nope=1"], "--param nope: the experiment has no parameter 'nope' (has [])"),
        (["batching-window", "--param", "windows=a,b"], "--param: 'a' is not a int"),
        (
            ["nosuch"],
            "experiment 'nosuch': no such packaged experiment (batching-window, burst-capacity, calibration-sweep,"
            " fairness, hot-swap, lora-rank, multi-lora, seed-benchmark, slo-search, token-budget) or file",
        ),
        (["fairness", "--resume"], "--resume needs --run-id (the experiment directory to continue)"),
        (["training-stability", "--sample-interval", "2"], "--sample-interval: a training experiment starts no server"),
        (
            ["fairness", "--server-command", "x"],
            "--server-command needs --server-url (where the started server answers)",
        ),
    ],
)
def test_cli_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["experiment", *argv, "--results", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"loadlens experiment: error: {message}\n"


def test_list_and_dry_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["experiment", "--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == [*available_experiments(), *training_names()]
    assert main(["experiment", "fairness", "--dry-run", "--results", str(tmp_path), "--run-id", "f"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["1", "fcfs", "profile", "mix", "scheduling_policy=fcfs"]
    assert out[-1] == f"2 trials x 1 repeats -> {tmp_path}/experiments/f/experiment_result.json"


def test_the_sample_interval_is_the_experiments_unless_the_flag_says() -> None:
    """calibration-sweep samples the server once a second (four times moved the CPU rig's 2-user TTFT median),
    every other packaged experiment four times a second."""
    assert load_experiment("calibration-sweep").spec.sample_interval == 1.0
    assert load_experiment("fairness").spec.sample_interval == 0.25
