"""Every run of an experiment gets its own prompt seed (runner.run_seed): the load generator draws request k's
prompt from (seed, k), so with one seed every trial would resend the earlier trials' prompts and a server's
prefix cache would serve them (docs/experiments.md, *Prompt seeds*)."""

from __future__ import annotations

from pathlib import Path

from loadlens.experiment.runner import SEEDS_PER_TRIAL, RunOptions, _load_argv, run_seed


def opts(run_id: str = "sweep", seed: int | None = None) -> RunOptions:
    return RunOptions(directory=Path("."), run_id=run_id, repeats=3, seed=seed)


def test_every_run_of_an_experiment_has_its_own_seed() -> None:
    seeds = [run_seed(opts(), trial, repeat) for trial in range(20) for repeat in range(1, 101)]
    assert len(set(seeds)) == len(seeds)


def test_the_seed_flag_sets_the_first_runs_seed_and_the_rest_follow() -> None:
    assert run_seed(opts(seed=7), 0, 1) == 7
    assert run_seed(opts(seed=7), 0, 3) == 9
    assert run_seed(opts(seed=7), 2, 1) == 7 + 2 * SEEDS_PER_TRIAL


def test_without_the_flag_the_base_follows_the_run_id() -> None:
    """The same run id (a --resume) gives the same seeds; another run id other prompts."""
    assert run_seed(opts("a"), 1, 2) == run_seed(opts("a"), 1, 2)
    assert run_seed(opts("a"), 0, 1) != run_seed(opts("b"), 0, 1)
    assert run_seed(opts("a"), 0, 1) == int("ca9781", 16)  # sha256("a") begins ca978112...


def test_the_load_command_carries_the_seed() -> None:
    argv = _load_argv(Path("p.yaml"), "http://h", Path("out"), "r1", opts(), dry=False, seed=1234)
    assert argv[argv.index("--seed") + 1] == "1234"
    assert "--seed" not in _load_argv(Path("p.yaml"), "http://h", Path("out"), "r1", opts(), dry=True)
