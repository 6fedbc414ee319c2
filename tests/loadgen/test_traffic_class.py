"""A traffic entry's `class` names its SLO class whatever priority it sends: an FCFS server refuses non-zero
priorities, so a mix judged by class must not depend on them (guide 4.3, loadlens experiment fairness)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loadgen.profile import ProfileError, parse_profile
from loadgen.results import class_shares
from loadlens.cli import main
from loadlens.contracts.slo import load_slos


def profile_doc(**entry: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "name": "c",
        "traffic": [{"name": "chat", "weight": 3, **entry}, {"name": "bulk", "class": "batch"}],
        "stages": [{"name": "s", "users": 1, "duration": 1}],
    }


def test_class_comes_from_the_entry_not_the_priority() -> None:
    slos = load_slos()
    profile = parse_profile(profile_doc(priority=0))
    chat, bulk = profile.traffic
    assert (chat.priority_class, bulk.priority_class) == (None, "batch")
    assert (chat.slo_class(slos).name, bulk.slo_class(slos).name) == ("interactive", "batch")
    assert bulk.effective_priority == 0  # sent as 0 (or not at all): FCFS accepts it
    assert class_shares(profile, slos) == {"interactive": 0.75, "batch": 0.25}


def test_class_overrides_the_priority_class() -> None:
    chat = parse_profile(profile_doc(priority=10, **{"class": "interactive"})).traffic[0]
    assert chat.slo_class(load_slos()).name == "interactive"


def test_bad_class_values_name_the_field() -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile(profile_doc(**{"class": 3}))
    assert str(err.value) == "traffic[0].class: must be an SLO class name, got 3"
    unknown = parse_profile(profile_doc(**{"class": "gold"})).traffic[0]
    with pytest.raises(ProfileError) as err:
        unknown.slo_class(load_slos())
    assert str(err.value).startswith("traffic chat.class: no SLO class 'gold' in ")
    assert str(err.value).endswith(" (classes: interactive, batch)")


def test_load_refuses_an_unknown_class_before_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile_doc(**{"class": "gold"})))
    assert main(["load", "--profile", str(path), "--host", "http://127.0.0.1:9", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("loadlens load: error: traffic chat.class: no SLO class 'gold' in ")
