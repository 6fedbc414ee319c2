"""The other two ways a trial's configuration reaches its server: a command template started per trial
(`--server-command`, its knobs filled in, waited for until healthy, stopped after), and a URL per trial.
The sim stands in for vLLM in both: its max_num_seqs bounds the requests it runs, which the runner's
/metrics sampler sees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.contracts.experiment_result import ExperimentResult, parse_experiment_result
from loadlens.util.child import http_child
from loadlens.util.net import free_port
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

PROFILE: dict[str, Any] = {
    "version": 1,
    "name": "p",
    "stop_timeout_s": 5,
    "defaults": {"endpoint": "completions", "output_tokens": {"mean": 64}},
    "traffic": [{"name": "t", "prompt": {"tokens": {"mean": 32}}}],
    "stages": [{"name": "s", "users": 12, "duration": 2}],
}
SERVE = [sys.executable, "-m", "loadlens.cli", "serve", "--engine", "sim", "--model-profile", "tiny"]
SERVE += ["--gpu-profile", "h100-sxm", "--speed", "0.2", "--log-level", "warning"]


def run(tmp_path: Path, exp: dict[str, Any], *args: str) -> tuple[ExperimentResult, str]:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    argv = [sys.executable, "-m", "loadlens.cli", "experiment", str(path), "--results", str(tmp_path), "--run-id", "m"]
    proc = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "experiments" / "m" / "experiment_result.json").read_text())
    return parse_experiment_result(doc), proc.stdout


def peak(result: ExperimentResult, trial: str) -> float:
    """The most requests the sampler saw running: max_num_seqs, forced by counts. 12 closed-loop users keep at
    least twice any trial's slots busy, and at speed 0.2 a request holds its slot for far longer than a client
    takes to send the next, so the queue never empties: in a loaded run each of the 7 samples of s2 and s6 read
    2 and 6 running (10 and 6 waiting), and 6 of trial a's 7 read 3."""
    value = next(t for t in result.trials if t.name == trial).figures["sampled.peak_running"].max
    assert value is not None
    return value


@pytest.mark.timeout(120)
def test_command_template_restarts_the_server_per_trial(tmp_path: Path) -> None:
    port = free_port()
    template = " ".join([*SERVE, "--port", str(port), "--knob", "max_num_seqs={max_num_seqs}"])
    exp = {
        "version": 1,
        "name": "cmd",
        "warmup": None,
        "profiles": {"p": PROFILE},
        "trials": [{"name": "s{max_num_seqs}", "profile": "p", "sweep": {"max_num_seqs": [2, 6]}}],
        "analysis": {"kind": "table", "columns": ["request_throughput", "sampled.peak_running"]},
    }
    result, _ = run(tmp_path, exp, "--server-command", template, "--server-url", f"http://127.0.0.1:{port}")
    assert result.server.mode == "command" and result.server.command == template
    assert [t.status for t in result.trials] == ["done", "done"]
    assert peak(result, "s2") == 2.0 and peak(result, "s6") == 6.0  # each server started with its trial's knob
    for name in ("s2", "s6"):
        assert (tmp_path / "experiments" / "m" / "trials" / name / "server.log").is_file()


def test_command_template_field_without_a_knob_is_a_usage_error(tmp_path: Path) -> None:
    exp = {"version": 1, "name": "cmd", "profiles": {"p": PROFILE}, "trials": [{"name": "a", "profile": "p"}],
           "analysis": {"kind": "table"}}  # fmt: skip
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    argv = [sys.executable, "-m", "loadlens.cli", "experiment", str(path), "--results", str(tmp_path)]
    argv += ["--server-command", "vllm serve m --max-num-seqs {max_num_seqs}", "--server-url", "http://127.0.0.1:9"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr == (
        "loadlens experiment: error: --server-command: trial a has no knob 'max_num_seqs' for the template "
        "(its knobs: none)\n"
    )


@pytest.mark.timeout(120)
def test_a_url_per_trial(tmp_path: Path) -> None:
    a, b = free_port(), free_port()
    with (
        http_child([*SERVE, "--port", str(a), "--knob", "max_num_seqs=3"], a, cwd=ROOT) as url_a,
        http_child([*SERVE, "--port", str(b), "--knob", "max_num_seqs=5"], b, cwd=ROOT) as url_b,
    ):
        exp = {
            "version": 1,
            "name": "urls",
            "warmup": None,
            "profiles": {"p": PROFILE},
            "trials": [
                {"name": "a", "profile": "p", "host": url_a},
                {"name": "b", "profile": "p", "host": url_b, "knobs": {"max_num_seqs": 4}},  # through b's admin API
            ],
            "analysis": {"kind": "table", "columns": ["sampled.peak_running"]},
        }
        result, _ = run(tmp_path, exp)
    assert result.server.mode == "urls"
    assert [(t.name, t.target) for t in result.trials] == [("a", url_a), ("b", url_b)]
    assert peak(result, "a") == 3.0 and peak(result, "b") == 4.0
