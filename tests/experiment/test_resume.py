"""Interrupting an experiment keeps its finished trials; --resume runs only the rest; a changed definition
or a second run into the same directory is refused (exit 2) before anything starts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.contracts.experiment_result import parse_experiment_result
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

EXPERIMENT: dict[str, Any] = {
    "version": 1,
    "name": "resume-me",
    "sim": {"model_profile": "tiny", "gpu_profile": "h100-sxm", "speed": 1},
    "parameters": {"seqs": [4, 8, 16]},
    "warmup": None,
    "profiles": {
        "p": {
            "version": 1,
            "name": "p",
            "stop_timeout_s": 5,
            "defaults": {"endpoint": "completions", "output_tokens": {"mean": 8}},
            "traffic": [{"name": "t", "prompt": {"tokens": {"mean": 32}}}],
            "stages": [{"name": "s", "users": 2, "duration": 2}],
        }
    },
    "trials": [{"name": "s{seqs}", "profile": "p", "sweep": {"seqs": {"knob": "max_num_seqs", "values": "${seqs}"}}}],
    "analysis": {"kind": "table", "columns": ["request_throughput", "sampled.mean_running"]},
}


def argv(path: Path, results: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "loadlens.cli", "experiment", str(path), "--results", str(results), "--run-id", "r",
            *extra]  # fmt: skip


def read(results: Path) -> Any:
    return json.loads((results / "experiments" / "r" / "experiment_result.json").read_text())


@pytest.mark.timeout(120)
def test_interrupt_keeps_finished_trials_and_resume_runs_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(EXPERIMENT))
    # SIGINT at its default in the child even when pytest runs as a shell's background job (which ignores it, and
    # an ignored SIGINT is inherited): Python then turns it into KeyboardInterrupt, as Ctrl-C would.
    proc = subprocess.Popen(argv(path, tmp_path), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if read(tmp_path)["trials"][0]["status"] == "done":
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the first trial never finished")
    # The second trial's load is running once `loadlens load` has printed its target line (flushed just before it
    # starts Locust): the interrupt lands inside that run, not before it, however slow the machine.
    log = tmp_path / "experiments" / "r" / "trials" / "s8" / "r1" / "load.log"
    deadline = time.monotonic() + 60
    while not (log.is_file() and "\ntarget http" in log.read_text(errors="replace")):
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the second trial's load never started")
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert f"continue with: loadlens experiment {path} --run-id r --resume" in out
    first = parse_experiment_result(read(tmp_path))
    assert first.interrupted and not first.completed
    assert [t.status for t in first.trials] == ["done", "pending", "pending"]
    assert first.trials[1].runs == []  # the interrupted run is not kept
    kept = first.trials[0].runs[0].start_timestamp

    again = subprocess.run(argv(path, tmp_path, "--resume"), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "trial 1/3" not in again.stdout and "trial 2/3 s8 repeat 1/1" in again.stdout
    done = parse_experiment_result(read(tmp_path))
    assert done.completed and not done.interrupted
    assert [t.status for t in done.trials] == ["done", "done", "done"]
    assert done.trials[0].runs[0].start_timestamp == kept
    assert [r["trial"] for r in done.tables[0].rows] == ["s4", "s8", "s16"]
    assert all(float(r["request_throughput"]) > 0 for r in done.tables[0].rows)  # type: ignore[arg-type]

    # the same directory without --resume, or with another definition, is refused before anything starts
    twice = subprocess.run(argv(path, tmp_path), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert twice.returncode == 2
    assert twice.stderr.strip().endswith(
        "experiment_result.json exists: pass --resume to continue it, or another --run-id"
    )
    changed = subprocess.run(argv(path, tmp_path, "--resume", "--param", "seqs=4,8,32"), cwd=ROOT,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert changed.returncode == 2
    assert "was written by a different experiment definition, parameters, repeats or scales" in changed.stderr
