"""benchmarks/gpu_lora_check.py on the CPU (its CUDA part is skipped there), the power-law fit, and the
snapshot-block matching of lora_alloc_figures.py on a synthetic snapshot."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import gpu_lora_check as glc
from benchmarks import lora_alloc_figures as laf
from benchmarks import lora_decode_timing as ldt


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, str]:
    """One CPU run at the smallest size, outside any one test: the first model run (torch, transformers and
    PEFT importing lazily) sets a process-wide variable (``TORCHINDUCTOR_CACHE_DIR``), which a test must not
    leave changed."""
    out = tmp_path_factory.mktemp("lora")
    argv = ["--out", str(out), "--device", "cpu", "--size", "tiny", "--ranks", "2,8,32", "--batches", "1,2"]
    argv += ["--prompt-tokens", "3", "--new-tokens", "3", "--warmup", "0", "--repeats", "1", "--threads", "1"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = glc.main(argv)
    return rc, out, printed.getvalue()


def test_cpu_run_at_the_smallest_size(cpu_run: tuple[int, Path, str]) -> None:
    rc, out, printed = cpu_run
    assert rc == 0
    result = json.loads((out / "lora.json").read_text())
    assert set(result) == {
        "tool", "device", "packages", "model", "decode", "adapter_path", "timing", "allocator", "checks", "ok",
        "seconds",
    }  # fmt: skip
    assert result["ok"] is True and all(c["ok"] for c in result["checks"]) and len(result["checks"]) == 3
    assert result["device"]["kind"] == "cpu" and result["decode"]["threads"] == 1
    assert result["model"] == {"size": "tiny", **ldt.TINY_SHAPE.__dict__, "dtype": "fp32"}
    # The adapter path is real: B = 0 adds exactly nothing, a random B moves the logits.
    path = result["adapter_path"]
    assert path["zero_b_max_abs_diff"] == 0.0 and path["random_b_max_abs_diff"] > 0.0
    assert result["allocator"] == {"skipped": "CPU run: the caching allocator and memory_snapshot() are CUDA-only"}
    assert [t["batch"] for t in result["timing"]] == [1, 2]
    for t in result["timing"]:
        rows = t["rows"]
        assert [r["variant"] for r in rows] == ["base", "lora-r2", "lora-r8", "lora-r32"]
        assert [r["steps"] for r in rows] == [2, 2, 2, 2]  # new tokens - 1 timed steps, 1 repeat
        # hidden 32, 1 layer, q 32 -> 32, v 32 -> 16, fp32: r * ((32 + 32) + (32 + 16)) * 4 bytes
        assert [r["adapter_bytes"] for r in rows] == [0, 896, 3584, 14336]
        assert [r["adapter_bytes_match_peft"] for r in rows] == [None, True, True, True]
        assert rows[0]["increment_median_ms"] == 0.0 and rows[0]["increment_ratio"] == 1.0
        assert all(r["median_ms"] > 0 and r["mean_ms"] > 0 for r in rows)
        assert set(t["fit"]) >= {"exponent", "dropped"}
    text = (out / "lora.md").read_text()
    assert "| lora-r32 | 14,336 |" in text and "Allocator figures: skipped" in text
    assert printed == text


def test_formula_bytes_equal_peft_tensor_bytes_at_the_cpu_size(cpu_run: tuple[int, Path, str]) -> None:
    model = ldt.build_model(ldt.TINY_SHAPE, torch, "cpu", torch.float32)
    peft_model = ldt.attach_lora(model, 4, torch, seed=0)
    assert ldt.lora_tensor_bytes(peft_model) == ldt.formula_bytes(ldt.TINY_SHAPE, 4, "fp32") == 4 * 112 * 4


def test_power_fit_recovers_an_exact_exponent() -> None:
    fit = ldt.power_fit([2, 8, 32], [0.3 * r**0.5 for r in (2, 8, 32)])
    assert fit["exponent"] == 0.5 and fit["exponent_se"] == 0.0 and math.isclose(fit["coefficient_ms"], 0.3)
    assert fit["sublinear"] is True and fit["sublinear_2se"] is True and fit["points"] == 3
    linear = ldt.power_fit([2, 8, 32], [2.0, 8.0, 32.0])
    assert linear["exponent"] == 1.0 and linear["sublinear"] is False


def test_power_fit_leaves_out_non_positive_increments() -> None:
    fit = ldt.power_fit([2, 8, 32], [-0.1, 1.0, 2.0])
    assert fit == {"exponent": None, "reason": "2 positive increment(s); a fit needs 3", "dropped": [2]}


def test_power_fit_standard_error_of_a_noisy_series() -> None:
    # log-log points (ln 2, 0), (ln 8, 1), (ln 32, 1): slope 1 / (2 ln 4), residuals -1/6, 1/3, -1/6
    fit = ldt.power_fit([2, 8, 32], [1.0, math.e, math.e])
    sxx = 2 * math.log(4) ** 2
    assert fit["exponent"] == round(math.log(4) / sxx, 4)
    assert fit["exponent_se"] == round(math.sqrt((1 / 36 + 1 / 9 + 1 / 36) / 1 / sxx), 4)


def _tensor(address: int, numel: int) -> SimpleNamespace:
    return SimpleNamespace(data_ptr=lambda: address, numel=lambda: numel, element_size=lambda: 2)


def test_module_blocks_match_tensors_to_snapshot_blocks_by_address() -> None:
    snapshot = [
        {
            "blocks": [
                {"address": 0x1000, "size": 66048, "state": "active_allocated"},
                {"address": 0x20000, "size": 65536, "state": "active_allocated"},
                {"address": 0x30000, "size": 4096, "state": "inactive"},
            ]
        },
        {"blocks": [{"address": 0x50000, "size": 33280, "state": "active_allocated"}]},
    ]
    tensors = {
        "layers.0.q_proj.lora_A.a1.weight": _tensor(0x1000, 32768),  # 65536 B asked, block 66048
        "layers.0.q_proj.lora_B.a1.weight": _tensor(0x20000, 32768),
        "layers.0.v_proj.lora_A.a1.weight": _tensor(0x50000, 16384),
        "layers.0.v_proj.lora_B.a1.weight": _tensor(0x30000, 2048),  # only an inactive block there: no match
    }
    assert laf.block_sizes(snapshot, [0x1000, 0x30000, 0x9]) == {0x1000: 66048}
    assert laf.module_blocks(tensors, snapshot) == {
        "modules": 2,
        "modules_matched": 1,
        "requested_per_module_bytes": [131072],
        "block_per_module_bytes": [131584],
        "overhead_per_module_bytes": [512],
    }


@pytest.mark.parametrize(
    "argv",
    [["--ranks", "2,x"], ["--batches", "0"], ["--new-tokens", "1"], ["--size", "huge"], ["--device", "tpu"]],
)
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        glc.parse_args(argv)
    assert exc.value.code == 2


def test_cuda_requested_without_cuda_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU host runs this test too
    assert glc.main(["--out", str(tmp_path), "--device", "cuda"]) == 2
    assert capsys.readouterr().err.startswith("gpu_lora_check: --device cuda but CUDA is not available")
    assert not (tmp_path / "lora.json").exists()
