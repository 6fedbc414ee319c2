"""tests/support/timeout_margins.py: the plugin that holds each test's timeout limit against its time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.timeout_margins import short_limits

TESTS = """
import time
import pytest

@pytest.mark.timeout(1)
def test_short_limit():
    time.sleep(0.3)

@pytest.mark.timeout(30)
def test_roomy_limit():
    time.sleep(0.3)

def test_ini_default():
    pass
"""


def test_each_test_is_written_with_its_limit_and_the_short_ones_listed(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    out = tmp_path / "margins.jsonl"
    argv = [sys.executable, "-m", "pytest", str(tmp_path / "test_sample.py"), "-p", "tests.support.timeout_margins",
            f"--timeout-margins={out}", "-p", "no:randomly", "-p", "no:cacheprovider", "-o", "timeout=60",
            f"--rootdir={tmp_path}", "-c", "/dev/null"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(text) for text in out.read_text().splitlines()]
    assert [(line["id"].split("::")[1], line["limit_s"]) for line in lines] == [
        ("test_short_limit", 1.0), ("test_roomy_limit", 30.0), ("test_ini_default", 60.0)]  # fmt: skip
    assert 0.3 <= lines[0]["seconds"] < 1.0
    assert "1 of 3 tests short" in proc.stdout
    assert "limit 1 s (suggest 30 s): " in proc.stdout and "test_sample.py::test_short_limit" in proc.stdout


def test_a_test_counts_by_its_last_line_and_no_limit_is_never_short() -> None:
    lines: list[dict[str, object]] = [
        {"id": "a", "seconds": 20.0, "limit_s": 60.0},
        {"id": "a", "seconds": 10.0, "limit_s": 60.0},
        {"id": "b", "seconds": 500.0, "limit_s": 0.0},
        {"id": "c", "seconds": 31.0, "limit_s": 150.0},
        {"id": "d", "seconds": 30.0, "limit_s": 150.0},
    ]
    assert short_limits(lines) == [("c", 31.0, 150.0, 180)]
