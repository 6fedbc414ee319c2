"""Profiles: every packaged profile loads; every mistake names its field; scaling and spike expansion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loadgen.profile import ProfileError, available_profiles, load_profile, parse_profile


def test_packaged_profiles_load() -> None:
    names = available_profiles()
    assert {"seed-stress", "quick", "burst", "priority-mix", "open-loop"} <= set(names)
    for name in names:
        profile = load_profile(name)
        assert profile.stages and profile.traffic and profile.sha256


def test_seed_stress_is_the_guide_procedure() -> None:
    p = load_profile("seed-stress")
    warmup, *rest = p.stages
    assert (warmup.warmup, warmup.users, warmup.until_requests) == (True, 4, 100)
    assert [(s.name, s.users, s.duration) for s in rest] == [("c8", 8, 180), ("c16", 16, 180), ("c32", 32, 180)]
    total = sum(t.weight for t in p.traffic)
    tail = next(t for t in p.traffic if t.name == "long-tail")
    assert tail.weight / total == pytest.approx(0.15)
    assert tail.prompt.tokens.mean == 2048 and tail.images.count == 1
    assert all(t.output_tokens is not None and t.output_tokens.mean == 256 for t in p.traffic)


def test_quick_runs_in_about_a_minute() -> None:
    p = load_profile("quick")
    measured = sum(s.duration or 0 for s in p.stages if not s.warmup)
    assert 45 <= measured <= 90


def test_burst_expands_spikes_into_named_stages() -> None:
    p = load_profile("burst")
    names = [s.name for s in p.stages]
    assert names[1:4] == ["burst-baseline-1", "burst-spike-1", "burst-baseline-2"]
    assert (p.stages[1].users, p.stages[2].users) == (8, 32)


def test_scaling() -> None:
    p = load_profile("open-loop").scaled(users=0.5, time=0.1)
    stage = p.stages[2]
    assert stage.rate == pytest.approx(2.0) and stage.max_concurrency == 64 and stage.duration == pytest.approx(6.0)
    assert p.stages[0].until_requests == 20  # counts are not scaled
    assert p.users_scale == 0.5 and p.time_scale == 0.1


BASE: dict[str, Any] = {
    "version": 1,
    "name": "t",
    "traffic": [{"name": "a", "weight": 1}],
    "stages": [{"name": "s", "users": 2, "duration": 5}],
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(BASE))
    node: Any = doc
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last = parts[-1]
    if value is KeyError:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("version", 2, "version: must be 1"),
        ("stages.0.users", 0, "stages[0].users: must be >= 1, got 0"),
        ("stages.0.users", "many", "stages[0].users: must be an integer"),
        ("stages.0.rate", 3, "stages[0]: set exactly one of users (closed loop) or rate"),
        ("stages.0.duration", KeyError, "stages[0]: set duration (seconds) or until_requests"),
        ("stages.0.duration", -1, "stages[0].duration: must be > 0"),
        ("stages.0.colour", "red", "stages[0].colour: unknown field"),
        ("stages.0.name", "has space", "stages[0].name: must match"),
        ("traffic.0.weight", 0, "traffic[0].weight: must be > 0"),
        ("traffic.0.endpoint", "embeddings", "traffic[0].endpoint: must be chat or completions"),
        ("traffic.0.prompt", {"tokens": {"mean": 10, "min": 20}}, "traffic[0].prompt.tokens.mean: 10 is outside"),
        ("traffic.0.prompt", {"source": "sharegpt"}, "traffic[0].prompt.path: a ShareGPT JSON file is required"),
        ("traffic.0.images", {"count": 1, "width": 99999}, "traffic[0].images: width and height must be <= 8192"),
        ("traffic.0.temperature", 3, "traffic[0].temperature: must be a number in [0, 2]"),
        ("traffic", [], "traffic: must be a non-empty list"),
        ("stages", [{"name": "w", "users": 1, "duration": 1, "warmup": True}], "every stage is a warmup stage"),
    ],
)
def test_errors_name_the_field(path: str, value: Any, message: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile(with_change(path, value))
    assert message in str(err.value)


def test_duplicate_stage_names_and_open_loop_fields_on_closed_stage() -> None:
    doc = with_change("stages", [{"name": "s", "users": 1, "duration": 1}, {"name": "s", "users": 2, "duration": 1}])
    with pytest.raises(ProfileError, match="stages: duplicate names"):
        parse_profile(doc)
    with pytest.raises(ProfileError, match="arrival and max_concurrency apply to open-loop"):
        parse_profile(with_change("stages.0.arrival", "constant"))


def test_unknown_profile_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="unknown profile 'nope'"):
        load_profile("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: [1\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(str(bad))


def test_sharegpt_path_is_relative_to_the_profile(tmp_path: Path) -> None:
    (tmp_path / "data.json").write_text('[{"conversations": [{"from": "human", "value": "hi"}]}]')
    doc = with_change("traffic.0.prompt", {"source": "sharegpt", "path": "data.json"})
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    profile = load_profile(str(tmp_path / "p.yaml"))
    assert profile.traffic[0].prompt.path == tmp_path / "data.json"


def test_a_file_error_holds_its_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(with_change("stages.0.users", 0), sort_keys=False))
    line = path.read_text().splitlines().index("  users: 0") + 1
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert str(err.value) == f"profile bad.yaml:{line}:3: stages[0].users: must be >= 1, got 0"
    assert err.value.problem is not None
    assert str(err.value.problem) == f"{path}:{line}:3: stages[0].users: must be >= 1, got 0"


def test_a_file_saved_without_an_extension_loads_by_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("mine").write_text(yaml.safe_dump(BASE))
    assert load_profile("mine").name == "t"
    with pytest.raises(ProfileError, match=r"^profile file missing.yaml: not found$"):
        load_profile("missing.yaml")
