"""No module of the product or its benchmarks is over 500 lines, except data and declarations.

A module that long holds more than one job: split it by job (the proxy's package, the load profile's models by
part, the benchmarks' pure judgements apart from their runners). A module that is long because it is a table or
a set of declarations (series, bucket sets, route documents) may stay long; it is listed here with why.
Tests are not counted: a test file holds the cases of one concern, and its length is the cases'.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.paths import ROOT

LIMIT = 500
PACKAGES = ("loadlens", "exporters", "loadgen", "benchmarks")
DECLARATIONS: dict[str, str] = {}
"""path -> why it may be longer: data and declarations only."""


def long_modules(root: Path = ROOT) -> dict[str, int]:
    found = {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            rel = path.relative_to(root).as_posix()
            if lines > LIMIT and rel not in DECLARATIONS:
                found[rel] = lines
    return found


def test_no_module_is_over_the_limit() -> None:
    assert long_modules() == {}


def test_every_exception_still_exists() -> None:
    assert [path for path in DECLARATIONS if not (ROOT / path).is_file()] == []


def test_the_count_sees_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "loadgen").mkdir()
    (tmp_path / "loadgen" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "loadgen" / "short.py").write_text("x = 1\n" * LIMIT)
    assert long_modules(tmp_path) == {"loadgen/long.py": LIMIT + 1}
