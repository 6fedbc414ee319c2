"""`loadlens stack restart`: its argument rules, exit 2 with one line for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlens.cli import main


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["stack", "restart"], "loadlens stack: error: restart needs a SERVICE, and only restart takes one"),
        (["stack", "up", "prometheus"], "loadlens stack: error: restart needs a SERVICE, and only restart takes one"),
    ],
)
def test_service_argument_rules(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]


def test_restart_without_a_running_stack_names_the_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stack", "restart", "prometheus", "--run-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"loadlens stack: error: no service 'prometheus' in {tmp_path.resolve() / 'stack.json'}; "
        "services: none (the stack is not running)"
    ]
