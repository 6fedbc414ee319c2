"""The installed pytest and pytest-xdist keep an xdist_group on one worker: make test relies on it (one live run and
one real vLLM per session, tests/conftest.py SESSION_GROUPS). pytest 9.2 with xdist 3.8 silently did not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import os
from pathlib import Path

import pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i: int) -> None:
    (Path(__file__).parent / f"worker-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


# A nested pytest starting two xdist workers: 12.9 s measured in the parallel phase on the loaded 2-core box;
# its own limit (120 s) is the bound, not pytest's 60 s default.
@pytest.mark.timeout(150)
def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q",
         "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = [(tmp_path / f"worker-{i}").read_text() for i in range(6)]
    assert len(set(workers)) == 1, workers
