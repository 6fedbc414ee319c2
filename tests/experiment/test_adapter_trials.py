"""An experiment with adapters, end to end on the sim: the adapters are written for the sim's model profile,
loaded before each run of the trials that name them and unloaded after, the load goes to them, and the result
records them (sizes by the guide's formula and the file's), per-model figures and the preparation time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.contracts.experiment_result import parse_experiment_result
from loadlens.lora import make_adapter
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

EXPERIMENT: dict[str, Any] = {
    "version": 1,
    "name": "adapters",
    "sim": {"model_profile": "tiny", "speed": 10},
    "parameters": {"ranks": [2, 8]},
    "warmup": None,
    "adapters": [{"name": "r{rank}", "rank": "${ranks}", "alpha": 16}],
    "profiles": {
        "mix": {
            "version": 1,
            "name": "mix",
            "traffic": [
                {
                    "name": "chat",
                    "prompt": {"tokens": {"mean": 16, "stdev": 0, "min": 16, "max": 16}},
                    "output_tokens": {"mean": 8, "stdev": 0, "min": 8, "max": 8},
                    "adapters": {"${adapter}": 3, "base": 1},
                }
            ],
            "stages": [{"name": "load", "users": 2, "until_requests": 16, "max_duration": 60}],
        }
    },
    "trials": [
        {
            "name": "rank{r}",
            "profile": "mix",
            "vars": {"adapter": "r{r}"},
            "adapters": ["r{r}"],
            "sweep": {"r": {"var": "rank", "values": "${ranks}"}},
        }
    ],
    "analysis": {"kind": "table", "columns": ["completed", "models.r2.completed", "models.r8.completed"]},
}


# A sim, two trials of Locust: 7.4 s measured in the parallel phase on the loaded 2-core box; its own limit
# (120 s) is the bound, not pytest's 60 s default.
@pytest.mark.timeout(150)
def test_trials_load_their_adapters_on_the_sim_and_report_per_model(tmp_path: Path) -> None:
    exp = tmp_path / "adapters.yaml"
    exp.write_text(yaml.safe_dump(EXPERIMENT, sort_keys=False))
    argv = [sys.executable, "-m", "loadlens.cli", "experiment", str(exp), "--results", str(tmp_path), "--run-id", "ci"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    directory = tmp_path / "experiments" / "ci"
    result = parse_experiment_result(json.loads((directory / "experiment_result.json").read_text()))

    reference = make_adapter("tiny", tmp_path / "ref", rank=8, alpha=16)
    assert [(a.name, a.rank, a.alpha, a.base) for a in result.adapters] == [("r2", 2, 16.0, "tiny"),
                                                                          ("r8", 8, 16.0, "tiny")]  # fmt: skip
    r8 = result.adapters[1]
    assert (r8.formula_bytes, r8.file_bytes) == (reference.formula_bytes, reference.file_bytes)
    assert r8.formula_bytes == 4 * r8.formula_bytes // 4 and result.adapters[0].formula_bytes * 4 == r8.formula_bytes
    assert (directory / "adapters" / "r8" / "adapter_model.safetensors").stat().st_size == r8.file_bytes
    assert r8.server_path == str((directory / "adapters" / "r8").resolve())

    assert [(t.name, t.adapters, t.status) for t in result.trials] == [("rank2", ["r2"], "done"),
                                                                      ("rank8", ["r8"], "done")]  # fmt: skip
    for trial, own, other in ((result.trials[0], "r2", "r8"), (result.trials[1], "r8", "r2")):
        figures = trial.runs[0].figures
        # 3:1 shares (each user's own round robin: exact to within a cycle per user): the trial's adapter and
        # the base model, nothing to the other adapter; every request succeeded (the adapter was loaded)
        own_done, base_done = figures[f"models.{own}.completed"], figures["models.tiny.completed"]
        assert figures["failed"] == 0.0 and own_done + base_done == figures["completed"] >= 16
        assert abs(own_done - 3 * base_done) <= 2 * 4
        assert f"models.{other}.completed" not in figures
        assert trial.runs[0].prepare_s is not None and trial.runs[0].prepare_s > 0
