"""A missing tool or package skips a test on a laptop and fails it under CI; no test skips by any other road."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.support import required
from tests.support.paths import ROOT

SKIP_CALLS = {"skip", "importorskip", "skipif"}


def test_a_missing_binary_skips_with_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        required.require_binary("loadlens-no-such-tool", how="apt-get install it")
    assert str(skipped.value) == "loadlens-no-such-tool not found: apt-get install it"


def test_under_ci_a_missing_binary_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as failed:
        required.require_binary("loadlens-no-such-tool", how="apt-get install it")
    assert str(failed.value) == "loadlens-no-such-tool not found: apt-get install it (required under CI)"


def test_the_first_name_found_or_the_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOADLENS_TEST_TOOL", raising=False)
    assert required.require_binary("loadlens-no-such-tool", "sh", how="-") == required.require_binary("sh", how="-")
    monkeypatch.setenv("LOADLENS_TEST_TOOL", "/opt/tool")
    assert required.require_binary("sh", how="-", env="LOADLENS_TEST_TOOL") == "/opt/tool"


def test_a_missing_module_skips_but_a_broken_one_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        required.require_module("loadlens_no_such_module")
    (tmp_path / "loadlens_broken_pkg.py").write_text("import loadlens_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="loadlens_no_such_dependency"):
        required.require_module("loadlens_broken_pkg")
    sys.modules.pop("loadlens_broken_pkg", None)
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception):
        required.require_module("loadlens_no_such_module")


def _skips(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in SKIP_CALLS:
            if isinstance(node.value, ast.Name) and node.value.id == "pytest":
                found.append(f"{path.relative_to(root)}:{node.lineno}: pytest.{node.attr}")
            elif isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
                found.append(f"{path.relative_to(root)}:{node.lineno}: pytest.mark.{node.attr}")
    return found


def test_no_test_skips_except_through_required() -> None:
    """A skip written by hand would pass silently in CI; tests/support/required.py is the one road."""
    own = {Path(required.__file__).resolve(), Path(__file__).resolve()}
    files = sorted(p for p in (ROOT / "tests").rglob("*.py") if p.resolve() not in own)
    assert [hit for path in files for hit in _skips(path)] == []


def test_the_scan_sees_each_kind_of_skip(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import pytest\n"
        "pytest.importorskip('x')\n"
        "@pytest.mark.skipif(True, reason='r')\n"
        "def test_a() -> None:\n    pytest.skip('r')\n"
    )
    assert _skips(probe, tmp_path) == [
        "test_probe.py:2: pytest.importorskip",
        "test_probe.py:3: pytest.mark.skipif",
        "test_probe.py:5: pytest.skip",
    ]
