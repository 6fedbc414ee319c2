"""Every generated file is current (``python -m loadlens.codegen --check``), and the generator refuses a
directory that is not a checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlens.codegen.__main__ import main
from tests.support.paths import ROOT


def test_committed_generated_files_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check", "--root", str(ROOT)]) == 0, capsys.readouterr().err


def test_check_names_a_stale_file_and_write_fixes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A copy of the checkout's inputs with one generated file edited by hand.
    for rel in ("pyproject.toml", "otel-collector.yaml", "deploy/compose/tempo.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    (tmp_path / "loadlens" / "codegen").mkdir(parents=True)
    assert main(["--root", str(tmp_path)]) == 0
    capsys.readouterr()
    rules = tmp_path / "alerts" / "loadlens-rules.yaml"
    assert rules.read_text() == (ROOT / "alerts" / "loadlens-rules.yaml").read_text()
    rules.write_text(rules.read_text() + "# edited\n")
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().err == "stale generated files (run `make generate`): alerts/loadlens-rules.yaml\n"
    assert main(["--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "wrote alerts/loadlens-rules.yaml\n"
    assert main(["--check", "--root", str(tmp_path)]) == 0


def test_refuses_a_directory_that_is_not_a_checkout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--check", "--root", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "is not a loadlens checkout" in capsys.readouterr().err
