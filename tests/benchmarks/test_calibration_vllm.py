"""benchmarks/calibration_vllm.py: the calibrate command it prints holds out only stages the sweep ran."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.calibration_vllm import HOLD_OUT, hold_out_flag


def _sweep(tmp_path: Path, names: list[str]) -> Path:
    (tmp_path / "experiment_result.json").write_text(json.dumps({"trials": [{"name": n} for n in names]}))
    return tmp_path


def test_the_hold_out_names_the_stages_the_sweep_ran(tmp_path: Path) -> None:
    assert HOLD_OUT == ("c4-p128", "p192-c2")
    full = ["c1-p128", "c2-p128", "c4-p128", "c8-p128", "p32-c2", "p192-c2", "p448-c2"]
    assert hold_out_flag(_sweep(tmp_path, full)) == " --hold-out c4-p128 p192-c2"
    # --param prompt_lengths=32: no p192-c2 to hold out (calibrate would refuse a stage that does not exist)
    assert hold_out_flag(_sweep(tmp_path, ["c1-p128", "c2-p128", "c4-p128", "p32-c2"])) == " --hold-out c4-p128"
    assert hold_out_flag(_sweep(tmp_path, ["c1-p128", "p32-c2"])) == ""
    # No result to read (the sweep failed): the rig's usual hold-out, as before.
    assert hold_out_flag(tmp_path / "missing") == " --hold-out c4-p128 p192-c2"
