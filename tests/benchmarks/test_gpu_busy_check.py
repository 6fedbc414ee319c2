"""benchmarks/gpu_busy_check.py: its CPU twin (the same hook and analysis, the perf_counter clock, a CPU on/off
load) recovers 29 ms and 84 ms within 1 ms; without CUDA the GPU run exits 2 with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu_busy_check as gbc
from tests.support import required


def test_the_cpu_twin_recovers_both_periods(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    required.require_module("torch")
    code = gbc.main(["--device", "cpu", "--seconds", "2", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "busy.json").read_text())
    assert code == 0, doc
    assert [p["period_s"] for p in doc["periods"]] == [0.029, 0.084]
    for p in doc["periods"]:
        assert p["clock"] == "perf_counter" and p["hook_synchronize_calls"] == 0
        assert p["intervals"] == p["forwards"]  # one interval per forward
        assert abs(p["recovered_period_s"] - p["period_s"]) <= 0.001
    assert capsys.readouterr().out.count("PASS") == 2


def test_without_cuda_the_gpu_run_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = required.require_module("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # whatever this host has
    assert gbc.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpu_busy_check: CUDA is not available (torch ")
    assert not (tmp_path / "out").exists()


def test_bad_arguments_exit_2() -> None:
    with pytest.raises(SystemExit) as err:
        gbc.parse_args(["--duty", "1.5"])
    assert err.value.code == 2
