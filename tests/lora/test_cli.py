"""``loadlens lora make`` end to end through ``loadlens.cli.main``: the table, ``--json`` and bad input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from loadlens.cli import main

MIB = 1024 * 1024


def test_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a"
    assert main(["lora", "make", "tiny", "--out", str(out), "--rank", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # tiny: 4 layers; q_proj 256 -> 256, v_proj 256 -> 128 (2 KV heads of 64); r = 2, bf16.
    assert lines[0] == f"adapter {out}: rank 2, alpha 4, bf16, B random"
    assert lines[1].split() == ["module", "d_in", "d_out", "layers", "params/layer", "params", "MiB"]
    assert lines[2].split() == ["q_proj", "256", "256", "4", "1024", "4096", "0.008"]
    assert lines[3].split() == ["v_proj", "256", "128", "4", "768", "3072", "0.006"]
    assert lines[4].split() == ["total", "7168", "0.014"]
    size = (out / "adapter_model.safetensors").stat().st_size
    assert lines[5].startswith(f"file adapter_model.safetensors: {size} bytes")
    assert lines[5].endswith("formula 14336 bytes")


def test_json_every_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a"
    argv = ["lora", "make", "tiny", "--out", str(out), "-r", "4", "--alpha", "3", "--target-modules", "all-linear",
            "--dtype", "fp32", "--seed", "5", "--init-b", "zero", "--base-name", "served", "--json"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {
        "base", "out", "rank", "alpha", "dtype", "init_b", "seed", "target_modules", "modules",
        "formula_params", "formula_bytes", "file_bytes", "header_bytes", "tensor_bytes", "tensors",
    }  # fmt: skip
    assert (doc["base"], doc["rank"], doc["alpha"], doc["dtype"], doc["init_b"], doc["seed"]) == (
        "tiny",
        4,
        3.0,
        "fp32",
        "zero",
        5,
    )
    assert doc["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert doc["modules"][-1] == {"module": "down_proj", "d_in": 768, "d_out": 256, "layers": 4,
                                  "params_per_layer": 4 * 1024, "params": 16 * 1024, "bytes": 64 * 1024}  # fmt: skip
    assert doc["formula_params"] == sum(m["params"] for m in doc["modules"])
    assert doc["formula_bytes"] == 4 * doc["formula_params"] == doc["tensor_bytes"]
    assert (
        doc["file_bytes"]
        == doc["header_bytes"] + doc["tensor_bytes"]
        == (out / "adapter_model.safetensors").stat().st_size
    )
    assert doc["tensors"] == 4 * 7 * 2
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 3, "served")


def test_hf_config_and_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 2,
                                  "num_hidden_layers": 1}))  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    (out / "other").write_text("kept")
    assert main(["lora", "make", str(config), "--out", str(out), "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["formula_params"] == 8 * (64 + 64)
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors", "other"]


def bad(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["lora", "make", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "o")
    assert bad(["nope", "--out", out], capsys).startswith("loadlens lora: error: unknown model profile 'nope'")
    assert (
        bad(["tiny", "--out", out, "--rank", "0"], capsys) == "loadlens lora: error: rank must be at least 1, got 0\n"
    )
    assert bad(["tiny", "--out", out, "--target-modules", "q_proj,lm_head"], capsys) == (
        "loadlens lora: error: target module 'lm_head' is not a linear layer of tiny "
        "(known: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)\n"
    )
    assert "a module is named twice" in bad(["tiny", "--out", out, "--target-modules", "q_proj,q_proj"], capsys)
    assert not Path(out).exists()  # nothing written for a bad input
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert bad(["tiny", "--out", str(blocker / "sub")], capsys).startswith(
        f"loadlens lora: error: out directory {blocker / 'sub'}: cannot create:"
    )
    assert (
        bad(["tiny", "--out", str(blocker)], capsys)
        == f"loadlens lora: error: out directory {blocker}: exists and is not a directory\n"
    )
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    assert bad(["tiny", "--out", str(full)], capsys) == (
        f"loadlens lora: error: out directory {full}: directory is not empty (--force, or force=True, writes into it)\n"
    )


def test_moe_config_lacks_mlp_modules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1,
                                  "num_local_experts": 4}))  # fmt: skip
    err = bad([str(config), "--out", str(tmp_path / "o"), "--target-modules", "up_proj"], capsys)
    reason = f"target module 'up_proj' is not a linear layer of {config} (known: q_proj, k_proj, v_proj, o_proj)"
    assert err == f"loadlens lora: error: {reason}\n"


def test_docs_name_every_flag_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from loadlens.cli import build_parser
    from tests.support.paths import ROOT

    docs = (ROOT / "docs" / "lora.md").read_text(encoding="utf-8")
    sub = next(a for a in build_parser("lora")._actions if isinstance(a, argparse._SubParsersAction))
    make = next(a for a in sub.choices["lora"]._actions if isinstance(a, argparse._SubParsersAction)).choices["make"]
    flags = [f for a in make._actions for f in a.option_strings if f.startswith("--") and f != "--help"]
    assert len(flags) == 10
    assert [f for f in flags if f"`{f}" not in docs] == []
    assert main(["lora", "make", "tiny", "--out", str(tmp_path / "a"), "--json"]) == 0
    keys = [*json.loads(capsys.readouterr().out), "params_per_layer", "d_in", "d_out"]
    assert [k for k in keys if f"`{k}`" not in docs] == []
