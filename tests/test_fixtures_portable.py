"""Committed fixtures name no path of the machine that wrote them: CI clones the repository somewhere else."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.paths import ROOT

# An absolute path into a checkout: "/anything/loadlens/...", "/anything/tests/..." and the like.
CHECKOUT_PATH = re.compile(r"(?<![\w.])/[\w./-]*/(?:loadlens|exporters|loadgen|tests|benchmarks)/[\w./-]+")


def machine_paths(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in {".json", ".yaml", ".yml", ".txt", ".om", ".prom", ".jsonl", ".csv"}:
            for match in CHECKOUT_PATH.finditer(path.read_text(encoding="utf-8", errors="replace")):
                found.append(f"{path.relative_to(root)}: {match.group(0)}")
    return found


def test_no_fixture_holds_a_checkout_path() -> None:
    assert machine_paths(ROOT / "tests" / "fixtures") == []


def test_the_scan_sees_one(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"source": "/work/wt/x/loadlens/contracts/slos.yaml", "ok": "loadlens/a.b"}')
    assert machine_paths(tmp_path) == ["a.json: /work/wt/x/loadlens/contracts/slos.yaml"]
