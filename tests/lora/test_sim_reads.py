"""The sim reads an adapter written by ``loadlens lora make`` for one of its profiles and sizes it for its cost
model exactly as the guide's formula in the report does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.serving.engine import LoRARequest
from exporters.serving.engines.sim.lora_adapters import read_adapter
from loadlens.cli import main
from loadlens.contracts.model_profile import load_model_profile


@pytest.mark.parametrize(("profile", "targets"), [("tiny", "all-linear"), ("qwen2-72b", "q_proj,v_proj")])
def test_sim_sizes_a_made_adapter_as_the_report_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: str, targets: str
) -> None:
    out = tmp_path / "a"
    argv = ["lora", "make", profile, "--out", str(out), "--rank", "4", "--target-modules", targets, "--json"]
    if profile != "tiny":
        argv += ["--init-b", "zero"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    adapter = read_adapter(LoRARequest("a", 1, str(out)), load_model_profile(profile))
    assert (adapter.rank, adapter.alpha) == (4, 8.0)
    assert list(adapter.target_modules) == doc["target_modules"]
    assert adapter.params == doc["formula_params"]
    assert adapter.nbytes == doc["formula_bytes"] == doc["tensor_bytes"]
