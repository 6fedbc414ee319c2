"""An experiment's ``adapters``: expanded per rank, named by templates, referenced by trials; every mistake is
refused before anything starts, naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadlens.experiment.models import ExperimentError, expand_adapters, expand_trials, parse_experiment, substitute

PROFILE: dict[str, Any] = {
    "version": 1,
    "name": "p",
    "traffic": [{"name": "t", "model": "${adapter}"}],
    "stages": [{"name": "s", "users": 1, "duration": 1}],
}


def doc(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "version": 1,
        "name": "x",
        "parameters": {"ranks": [2, 8, 32]},
        "adapters": [{"name": "r{rank}", "rank": "${ranks}", "alpha": 16}],
        "profiles": {"p": PROFILE},
        "trials": [
            {
                "name": "rank{r}",
                "profile": "p",
                "vars": {"adapter": "r{r}"},
                "adapters": ["r{r}"],
                "sweep": {"r": {"var": "rank", "values": "${ranks}"}},
            }
        ],
        "analysis": {"kind": "table"},
    }
    base.update(changes)
    return base


def parse(d: dict[str, Any]) -> Any:
    return parse_experiment(d, Path("x.yaml"))


def test_a_rank_list_parameter_gives_one_adapter_per_rank_and_trials_load_theirs() -> None:
    exp = parse(doc())
    adapters = expand_adapters(exp)
    assert [(a.name, a.rank, a.alpha, a.target_modules, a.dtype, a.init_b) for a in adapters] == [
        ("r2", 2, 16.0, ("q_proj", "v_proj"), "bf16", "random"),
        ("r8", 8, 16.0, ("q_proj", "v_proj"), "bf16", "random"),
        ("r32", 32, 16.0, ("q_proj", "v_proj"), "bf16", "random"),
    ]
    trials = expand_trials(exp)
    assert [(t.name, t.adapters, t.vars) for t in trials] == [
        ("rank2", ("r2",), {"adapter": "r2", "rank": 2}),
        ("rank8", ("r8",), {"adapter": "r8", "rank": 8}),
        ("rank32", ("r32",), {"adapter": "r32", "rank": 32}),
    ]


def test_alpha_defaults_to_twice_the_rank_and_a_fixed_rank_is_one_adapter() -> None:
    exp = parse(doc(adapters=[{"name": "a", "rank": 4, "dtype": "fp32", "init_b": "zero"}],
                    trials=[{"name": "t", "profile": "p", "vars": {"adapter": "a"}, "adapters": ["a"]}]))  # fmt: skip
    (a,) = expand_adapters(exp)
    assert (a.name, a.rank, a.alpha, a.dtype, a.init_b) == ("a", 4, 8.0, "fp32", "zero")


def test_a_param_override_changes_the_ranks() -> None:
    exp = parse(doc()).with_parameters({"ranks": "4,16"})
    assert [a.name for a in expand_adapters(exp)] == ["r4", "r16"]
    assert [t.adapters for t in expand_trials(exp)] == [("r4",), ("r16",)]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"adapters": [{"name": "r", "rank": "${ranks}"}]}, "x.yaml: adapters: duplicate adapter names ['r']"),
        ({"adapters": [{"name": "r{rank}", "rank": 0}]}, "x.yaml: adapters.0.rank: must be at least 1, got 0"),
        ({"adapters": [{"name": "r{rank}", "rank": "8"}]}, "adapters.0.rank: a positive integer or '${PARAM}'"),
        ({"adapters": [{"name": "r{rank}", "rank": "${nope}"}]}, "adapters.0.rank: ${nope} must give positive"),
        ({"adapters": [{"name": "r {rank}", "rank": 2}]}, "adapters.0.name: 'r 2' is not a safe adapter name"),
        ({"adapters": [{"name": "r{rank}", "rank": 2, "dtype": "int8"}]}, "adapters.0.dtype: Input should be"),
        ({"adapters": [{"name": "r{rank}", "rank": 2, "target_modules": []}]}, "adapters.0.target_modules:"),
        ({"adapters": [{"name": "r{rank}", "rank": 2, "alpha": 0}]}, "adapters.0.alpha:"),
        ({"adapters": [{"name": "r{rank}", "rank": 2, "colour": 1}]}, "adapters.0.colour: Extra inputs"),
    ],
)
def test_bad_adapters_are_refused_naming_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ExperimentError) as err:
        parse(doc(**changes))
    assert message in str(err.value)


def test_a_trial_naming_an_unknown_adapter_is_refused() -> None:
    d = doc()
    d["trials"][0]["adapters"] = ["q{r}"]
    with pytest.raises(ExperimentError) as err:
        parse(d)
    assert (
        str(err.value) == "x.yaml: trials.0.adapters: no adapter 'q2' (the experiment's adapters: ['r2', 'r32', 'r8'])"
    )


def test_a_trial_naming_an_adapter_twice_is_refused() -> None:
    d = doc()
    d["trials"][0]["adapters"] = ["r{r}", "r{r}"]
    with pytest.raises(ExperimentError, match=r"trials.0.adapters: an adapter is named twice: \['r2', 'r2'\]"):
        parse(d)


def test_a_var_template_with_an_unknown_field_is_refused() -> None:
    d = doc()
    d["trials"][0]["vars"] = {"adapter": "r{nope}"}
    with pytest.raises(ExperimentError, match=r"trials.0.vars.adapter: cannot fill 'r\{nope\}'"):
        parse(d)


def test_a_placeholder_key_becomes_the_value_text_and_an_unknown_one_is_refused() -> None:
    traffic = {"adapters": {"${adapter}": 70, "base": 30}}
    assert substitute(traffic, {"adapter": "r8"}) == {"adapters": {"r8": 70, "base": 30}}
    with pytest.raises(ExperimentError, match=r"profile variable \$\{adapter\} has no value"):
        substitute(traffic, {})
