"""``loadlens.lora.make_adapter``, the library entry point (the experiment runner's ``adapters:`` calls it)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from loadlens.lora import AdapterReport, LoraError, make_adapter
from loadlens.lora.sizes import ModuleSize


def test_report_carries_formula_and_file_sizes(tmp_path: Path) -> None:
    out = tmp_path / "a"
    report = make_adapter("tiny", out, rank=2, target_modules=["v_proj", "q_proj"], seed=3)
    assert isinstance(report, AdapterReport)
    # tiny: 4 layers; q_proj 256 -> 256, v_proj 256 -> 128; r = 2, bf16 (2 bytes).
    assert report.modules == (
        ModuleSize("q_proj", 256, 256, 4, 2 * (256 + 256), 4 * 1024, 2 * 4 * 1024),
        ModuleSize("v_proj", 256, 128, 4, 2 * (256 + 128), 4 * 768, 2 * 4 * 768),
    )
    assert (report.formula_params, report.formula_bytes) == (7168, 14336)
    assert report.tensor_bytes == report.formula_bytes
    assert report.file_bytes == (out / "adapter_model.safetensors").stat().st_size
    assert report.file_bytes == report.header_bytes + report.tensor_bytes
    assert (report.rank, report.alpha, report.dtype, report.init_b, report.seed, report.tensors) == (
        2, 4.0, "bf16", "random", 3, 16,
    )  # fmt: skip
    assert (report.base, report.out, report.target_modules) == ("tiny", out, ("q_proj", "v_proj"))
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (2, 4, "tiny")


def test_as_json_is_the_cli_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from loadlens.cli import main

    argv = ["lora", "make", "tiny", "--out", str(tmp_path / "cli"), "-r", "4", "--target-modules", "all-linear",
            "--dtype", "fp32", "--init-b", "zero", "--seed", "5", "--alpha", "3", "--json"]  # fmt: skip
    assert main(argv) == 0
    cli_doc = json.loads(capsys.readouterr().out)
    report = make_adapter("tiny", tmp_path / "lib", rank=4, alpha=3, target_modules="all-linear", dtype="fp32",
                          init_b="zero", seed=5)  # fmt: skip
    lib_doc = report.as_json()
    assert lib_doc.pop("out") == str(tmp_path / "lib")
    assert cli_doc.pop("out") == str(tmp_path / "cli")
    assert lib_doc == cli_doc
    # The same arguments write the same bytes.
    assert (tmp_path / "lib" / "adapter_model.safetensors").read_bytes() == (
        tmp_path / "cli" / "adapter_model.safetensors"
    ).read_bytes()


def test_target_modules_as_list_string_or_all_linear(tmp_path: Path) -> None:
    as_list = make_adapter("tiny", tmp_path / "l", rank=1, target_modules=["down_proj", "k_proj"])
    as_text = make_adapter("tiny", tmp_path / "t", rank=1, target_modules=" k_proj, down_proj ")
    every = make_adapter("tiny", tmp_path / "e", rank=1, target_modules=["all-linear"])
    assert as_list.target_modules == as_text.target_modules == ("k_proj", "down_proj")
    assert every.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_model_directory_as_path(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 32, "intermediate_size": 48,
                                                   "num_attention_heads": 2, "num_hidden_layers": 3}))  # fmt: skip
    report = make_adapter(model, tmp_path / "a", rank=8, target_modules=["gate_proj"], base_name="served")
    assert (report.base, report.formula_params) == (str(model), 3 * 8 * (32 + 48))
    assert json.loads((tmp_path / "a" / "adapter_config.json").read_text())["base_model_name_or_path"] == "served"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rank": 0}, "rank must be at least 1, got 0"),
        ({"rank": True}, "rank must be an integer, got True"),
        ({"rank": 2.0}, "rank must be an integer, got 2.0"),
        ({"seed": -1}, "seed must be at least 0, got -1"),
        ({"alpha": 0}, "alpha must be a finite number > 0, got 0"),
        ({"alpha": math.nan}, "alpha must be a finite number > 0, got nan"),
        ({"dtype": "int8"}, "dtype must be one of bf16, fp16, fp32, got 'int8'"),
        ({"init_b": "ones"}, "init_b must be one of random, zero, got 'ones'"),
        ({"target_modules": []}, "target modules: give at least one module"),
        ({"target_modules": ["q_proj", "q_proj"]}, "target modules: a module is named twice: ['q_proj', 'q_proj']"),
        ({"target_modules": [1]}, "target modules must be names, got [1]"),
        ({"base": "nope"}, "unknown model profile 'nope' (known: deepseek-r1-distill-llama-8b, deepseek-vl-7b, "
                           "qwen2-72b, qwen2.5-7b, qwen3-8b, tiny; or pass a YAML path)"),
    ],
)  # fmt: skip
def test_bad_input_raises_one_line_and_writes_nothing(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    kwargs: dict[str, Any] = {"base": "tiny", "out_dir": tmp_path / "o", "rank": 2} | changes
    with pytest.raises(LoraError) as caught:
        make_adapter(**kwargs)
    assert str(caught.value) == message
    assert isinstance(caught.value, ValueError)
    assert not (tmp_path / "o").exists()


def test_non_empty_out_needs_force(tmp_path: Path) -> None:
    out = tmp_path / "o"
    make_adapter("tiny", out, rank=1)
    with pytest.raises(LoraError, match=r"directory is not empty \(--force, or force=True, writes into it\)$"):
        make_adapter("tiny", out, rank=1)
    assert make_adapter("tiny", out, rank=2, force=True).rank == 2
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 2
