"""``loadlens gpu-bench`` through ``loadlens.cli.main``: refusing without torch or a GPU (exit 2, one line), bad
flags, model shapes from a config.json, and the CPU smoke test end to end (JSON, tables, report page)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from loadlens.cli import main
from loadlens.contracts.gpu_bench_result import parse_gpu_bench
from loadlens.gpubench import cli
from loadlens.gpubench.model_shape import ModelShapeError, model_shape
from loadlens.gpubench.plan import build_plan

TINY = ["--model", "tiny", "--shapes", "32x2", "--contexts", "64,128", "--decode-batch", "2", "--prefill-tokens",
        "16", "--decode-tokens", "2", "--graph-layers", "1", "--graph-width", "64", "--graph-batch", "2",
        "--warmup", "1", "--iterations", "2", "--dtypes", "bf16"]  # fmt: skip


def fake_torch(*, cuda_build: bool) -> Any:
    return SimpleNamespace(
        __version__="2.11.0+cu130" if cuda_build else "2.11.0+cpu",
        version=SimpleNamespace(cuda="13.0" if cuda_build else None),
        cuda=SimpleNamespace(is_available=lambda: False),
    )


def test_torch_problem_names_the_cause() -> None:
    assert cli.torch_problem(None, "cuda") == (
        "needs PyTorch, which is not installed (pip install torch, a CUDA build for a GPU)")  # fmt: skip
    assert cli.torch_problem(fake_torch(cuda_build=False), "cuda") == (
        "no GPU: torch 2.11.0+cpu is a CPU-only build (install a CUDA build of torch)")  # fmt: skip
    assert cli.torch_problem(fake_torch(cuda_build=True), "cuda") == (
        "no GPU: torch 2.11.0+cu130 (CUDA 13.0) sees no CUDA device")  # fmt: skip
    assert cli.torch_problem(fake_torch(cuda_build=True), "cpu") is None


@pytest.mark.parametrize(
    ("torch", "line"),
    [
        (
            None,
            "loadlens gpu-bench: error: needs PyTorch, which is not installed (pip install torch, a CUDA build "
            "for a GPU)",
        ),  # fmt: skip
        (
            fake_torch(cuda_build=True),
            "loadlens gpu-bench: error: no GPU: torch 2.11.0+cu130 (CUDA 13.0) sees no CUDA device",
        ),  # fmt: skip
    ],
)
def test_refuses_without_torch_or_gpu(
    torch: Any, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_import_torch", lambda: torch)
    assert main(["gpu-bench", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [line]
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_refuses_when_torch_cannot_be_imported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert main(["gpu-bench"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "loadlens gpu-bench: error: needs PyTorch, which is not installed (pip install torch, a CUDA build for a GPU)"
    ]


def test_refuses_with_the_installed_torch_and_no_device(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU host runs this test too
    assert main(["gpu-bench"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("loadlens gpu-bench: error: no GPU: torch ")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--device", "cpu", "--write-profile", "x.yaml"],
         "loadlens gpu-bench: error: --write-profile needs a GPU run (--device cpu is a smoke test)"),
        (["--graph-width", "100"],
         "loadlens gpu-bench: error: --graph-width 100: must be a multiple of 64 (head dimension 64)"),
        (["--model", "nope"], "loadlens gpu-bench: error: --model: unknown model profile 'nope' (known: "
                              "deepseek-r1-distill-llama-8b, deepseek-vl-7b, qwen2-72b, qwen2.5-7b, qwen3-8b, tiny; "
                              "or pass a YAML path)"),
        (["--device", "cpu", "--gpu-profile", "h300"], "loadlens gpu-bench: error: --gpu-profile: unknown GPU "
         "profile 'h300' (known: a100-40gb-pcie, a100-80gb-sxm, h100-sxm, h200; or pass a YAML path)"),
    ],
)  # fmt: skip
def test_usage_errors_exit_2(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpu-bench", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.parametrize("flag", [["--shapes", "512"], ["--contexts", "0"], ["--dtypes", "fp8"], ["--skip", "x"]])
def test_bad_flag_values_exit_2(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["gpu-bench", *flag])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("loadlens gpu-bench: error: argument ")


def test_model_shape_from_config_json(tmp_path: Path) -> None:
    config = {"num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
              "intermediate_size": 1536}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = model_shape(str(tmp_path))
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate) == (
        2, 512, 8, 2, 64, 1536)  # fmt: skip
    nested = tmp_path / "vl.json"
    nested.write_text(json.dumps({"text_config": {**config, "head_dim": 128, "num_local_experts": 8}}))
    moe = model_shape(str(nested))
    assert (moe.heads, moe.head_dim, moe.kv_heads, moe.intermediate) == (8, 128, 2, None)
    # Without a dense MLP the GEMM points are the query projection only.
    assert [(g.phase, g.label, g.m, g.n, g.k) for g in build_plan(moe, quick=True, causal=False).gemms] == [
        ("prefill", "q_proj", 4096, 1024, 512), ("decode", "q_proj", 8, 1024, 512)]  # fmt: skip
    (tmp_path / "bad.json").write_text(json.dumps({"kv_lora_rank": 512}))
    with pytest.raises(ModelShapeError, match="multi-head latent attention"):
        model_shape(str(tmp_path / "bad.json"))


def test_cpu_smoke_test_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpu-bench", "--device", "cpu", *TINY, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2] == f"note: {cli.CPU_NOTE}"
    result = parse_gpu_bench(json.loads((tmp_path / "gpu_bench.json").read_text()))
    assert result.device.kind == "cpu" and result.device.peak_tensor_flops is None
    assert result.model.name == "tiny" and (result.model.heads, result.model.head_dim) == (4, 64)
    assert [(r.backend, r.seq_len, r.batch) for r in result.attention] == [
        ("cudnn", 32, 2), ("flash", 32, 2), ("efficient", 32, 2), ("math", 32, 2)]  # fmt: skip
    math = [r for r in result.attention + result.decode if r.backend == "math"]  # type: ignore[operator]
    assert [r.status for r in math] == ["ok", "ok", "ok"]
    assert all(r.median_seconds > 0 for r in math)  # type: ignore[operator]
    # The CPU build has no cuDNN or memory-efficient kernel: unavailable, with PyTorch's reason.
    cudnn = next(r for r in result.attention if r.backend == "cudnn")
    assert cudnn.status == "unavailable" and cudnn.reason and cudnn.tflops is None
    # K and V, batch 2, 4 heads, context 64 and 128, head dim 64, 2 bytes
    kv = [r.kv_bytes for r in result.decode if r.backend == "math"]
    assert kv == [2 * 2 * 4 * 64 * 64 * 2, 2 * 2 * 4 * 128 * 64 * 2]
    assert all(r.share_of_peak is None for r in result.attention)
    assert [(r.op, r.phase, r.status) for r in result.roofline] == [
        ("gemm", "prefill", "ok")] * 3 + [("gemm", "decode", "ok")] * 3 + [("copy", "prefill", "ok"),
        ("copy", "decode", "ok")]  # fmt: skip
    graph = result.graph
    assert graph is not None and (graph.capture_ok, graph.reason, graph.layers, graph.width) == (
        False, "no CUDA graphs on the CPU", 1, 64)  # fmt: skip
    assert graph.eager_step_seconds > 0 and graph.replay_step_seconds is None

    # The report page renders the same tables.
    assert main(["report", "--results", str(tmp_path)]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<title>loadlens report: gpu-bench on " in page and "(CPU smoke test)</title>" in page
    for title in ("3.1 Attention throughput (prefill)", "3.2 Decode KV-cache read bandwidth",
                  "Roofline points (GEMM and copy)", "3.3 CUDA graph capture and first-call latency"):  # fmt: skip
        assert f">{title}</h2>" in page
    assert f"<li>{cli.CPU_NOTE}</li>" in page


def test_skip_sections(tmp_path: Path) -> None:
    argv = ["gpu-bench", "--device", "cpu", *TINY, "--out", str(tmp_path), "--skip", "attention", "--skip",
            "decode", "--skip", "graph"]  # fmt: skip
    assert main(argv) == 0
    result = parse_gpu_bench(json.loads((tmp_path / "gpu_bench.json").read_text()))
    assert (result.attention, result.decode, result.graph, len(result.roofline)) == ([], [], None, 8)


def test_report_refuses_a_broken_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gpu_bench.json").write_text(json.dumps({"kind": "loadlens-gpu-bench", "version": 1}))
    assert main(["report", "--results", str(tmp_path / "gpu_bench.json")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "loadlens report: error: gpu_bench.json: created: Field required"]  # fmt: skip


def test_help_imports_no_torch() -> None:
    """``loadlens gpu-bench --help`` works on an install without torch: torch is imported only to measure."""
    import subprocess

    from tests.support.paths import ROOT

    code = (
        "import sys\n"
        "from loadlens.cli import main\n"
        "try:\n    main(['gpu-bench', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('TORCH', 'torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "TORCH False"
