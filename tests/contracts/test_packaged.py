"""The one packaged-name-or-path rule (loadlens/contracts/packaged.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlens.contracts.packaged import UnknownName, packaged_names, resolve_packaged


@pytest.fixture
def packaged(tmp_path: Path) -> Path:
    directory = tmp_path / "packaged"
    directory.mkdir()
    for name in ("quick", "burst"):
        (directory / f"{name}.yaml").write_text(f"name: {name}\n")
    (directory / "notes.txt").write_text("not a profile\n")
    return directory


def test_names_and_packaged_files(packaged: Path) -> None:
    assert packaged_names(packaged) == ["burst", "quick"]
    assert resolve_packaged("quick", packaged, "profile") == packaged / "quick.yaml"


def test_a_slash_or_a_yaml_suffix_is_a_path(packaged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\n")
    assert resolve_packaged(str(mine), packaged, "profile") == mine
    monkeypatch.chdir(tmp_path)
    assert resolve_packaged("mine.yaml", packaged, "profile") == Path("mine.yaml")
    with pytest.raises(UnknownName) as err:
        resolve_packaged("quick.yaml", packaged, "profile")  # a path: not the packaged quick
    assert str(err.value) == "profile file quick.yaml: not found"
    assert err.value.path_like


def test_a_packaged_name_wins_over_a_local_file_and_a_bare_file_is_the_last_resort(
    packaged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick").write_text("name: local\n")
    (tmp_path / "custom").write_text("name: custom\n")
    assert resolve_packaged("quick", packaged, "profile") == packaged / "quick.yaml"
    assert resolve_packaged("custom", packaged, "profile") == Path("custom")


def test_an_unknown_name_lists_the_packaged_ones(packaged: Path) -> None:
    with pytest.raises(UnknownName) as err:
        resolve_packaged("nope", packaged, "GPU profile")
    assert str(err.value) == "unknown GPU profile 'nope' (known: burst, quick; or pass a YAML path)"
    assert (err.value.known, err.value.path_like) == (["burst", "quick"], False)
    with pytest.raises(UnknownName):
        resolve_packaged("", packaged, "profile")
