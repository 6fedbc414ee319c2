"""The training experiments for real at a tiny scale (CPU, the same code path as the default runs): a
randomly initialised Llama with PEFT LoRA and gradient checkpointing, determinism for a seed, a learning-rate
spike counted as a crash, and each experiment end to end through ``loadlens experiment`` (resume, compare,
report)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from loadlens.cli import main
from loadlens.contracts.experiment_result import parse_experiment_result
from loadlens.contracts.slo import load_slos
from loadlens.experiment.training.config import TrainConfig
from loadlens.experiment.training.engine import train
from loadlens.experiment.training.figures import run_figures
from loadlens.experiment.training.spec import training_path

TINY: dict[str, Any] = {"micro_batch": 2, "seq_len": 8, "val_sequences": 4, "eval_every": 3, "model": "small",
                        "device": "cpu", "target_loss": 4.5}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny(**kw: Any) -> TrainConfig:
    return TrainConfig(**{**TINY, "steps": 6, **kw})


def test_a_run_is_deterministic_for_its_seed() -> None:
    a = train(_tiny(seed=3), run_name="a")
    b = train(_tiny(seed=3), run_name="b")
    c = train(_tiny(seed=4), run_name="c")
    assert [s.loss for s in a.steps] == [s.loss for s in b.steps]
    assert a.evals == b.evals and [s.grad_norm for s in a.steps] == [s.grad_norm for s in b.steps]
    assert [s.loss for s in a.steps] != [s.loss for s in c.steps]
    assert a.gradient_checkpointing is True and a.crash is None and len(a.steps) == 6
    assert a.memory_source == "process_rss" and all(s.memory_bytes for s in a.steps)
    assert a.trainable_parameters == 2 * 2 * 8 * (64 + 64) + 64 * 64  # q/v A and B in 2 layers + the LM head


def test_a_learning_rate_spike_is_counted_as_a_crash() -> None:
    cfg = _tiny(steps=12, lora=False, spike_step=3, spike_factor=5000.0, spike_steps=2)
    record = train(cfg, run_name="spike")
    figures, outcome = run_figures(cfg, record, load_slos())
    assert record.crash is not None and record.crash.kind in ("non_finite", "divergence")
    assert figures["crashed"] == 1.0 and figures["crash_step"] == float(record.crash.step) < 12
    assert figures["steps_run"] == figures["crash_step"] and figures["final_val_loss"] is None
    # the spiked step's gradient norm is far above its EMA: the jump alert fires on the crash step
    assert outcome.grad_norm_jump_steps == [record.crash.step] and figures["alert.grad_norm_jump"] == 1.0
    healthy, _ = run_figures(replace(cfg, spike_step=0), train(replace(cfg, spike_step=0), run_name="ok"), load_slos())
    assert healthy["crashed"] == 0.0 and healthy["steps_run"] == 12.0
    assert healthy["grad_norm_jumps"] == 0.0 and healthy["alert.grad_norm_jump"] == 0.0


def _write(tmp_path: Path, name: str, params: dict[str, Any], repeats: int) -> Path:
    packaged = training_path(name)
    assert packaged is not None
    doc = yaml.safe_load(packaged.read_text())
    doc["parameters"].update(TINY)
    doc["parameters"].update(params)
    doc["repeats"] = repeats
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_training_stability_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "training-stability", {"steps": 8, "save_every": 4}, repeats=2)
    argv = ["experiment", str(path), "--results", str(tmp_path), "--run-id", "s"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "trial 4/4 gc-lora-dynamic seed 1 (run 8/8)" in out and "ETA" in out
    exp_dir = tmp_path / "experiments" / "s"
    result = parse_experiment_result(json.loads((exp_dir / "experiment_result.json").read_text()))
    assert result.completed and result.server.mode == "none"
    assert [t.name for t in result.tables] == ["stability", "telemetry", "alerts"]
    rows = {r["configuration"]: r for r in result.tables[0].rows}
    assert list(rows) == ["baseline", "gc-only", "gc-lora", "gc-lora-dynamic"]
    assert rows["baseline"]["runs"] == 2 and rows["baseline"]["crash_high"] == pytest.approx(0.6576, abs=1e-4)
    assert rows["gc-lora"]["checkpoints_saved"] == 2.0  # steps 4 and 8
    findings = {f.name: f.passed for f in result.findings}
    assert findings["dynamic_rule_leaves_training_unchanged"] is True
    assert findings["gradient_checkpointing_leaves_training_unchanged"] is True
    run = json.loads((exp_dir / "trials/gc-lora-dynamic/r1/training_run.json").read_text())
    decisions = [s["step"] for s in run["record"]["steps"] if s["decision"] is not None]
    assert decisions == [4, 8]
    # resumed with every run done: nothing runs again, the result stays
    assert main([*argv, "--resume"]) == 0
    assert "seed" not in capsys.readouterr().out.split("crash rate")[0]
    assert main(["compare", str(exp_dir)]) == 0
    table = capsys.readouterr().out
    assert "convergence_step" in table and "s/gc-lora-dynamic" in table
    assert main(["report", "--results", str(exp_dir), "--prometheus", "http://127.0.0.1:9"]) == 0


def test_accumulation_sensitivity_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "accumulation-sensitivity", {"accumulations": [1, 2, 4], "budget": 8}, repeats=1)
    assert main(["experiment", str(path), "--results", str(tmp_path), "--run-id", "a"]) == 0
    result = parse_experiment_result(json.loads((tmp_path / "experiments/a/experiment_result.json").read_text()))
    rows = result.tables[0].rows
    assert [(r["accumulation"], r["optimizer_steps"]) for r in rows] == [(1, 8.0), (2, 4.0), (4, 2.0)]
    assert rows[0]["val_loss_change"] == 0.0 and all(r["final_val_loss"] for r in rows)
    assert [p.name for p in result.plots] == ["grad_norm_std", "val_loss_change"]
    assert (tmp_path / "experiments/a/report.html").read_text().count("<img") == 2
    capsys.readouterr()


@pytest.mark.parametrize(
    ("param", "field"),
    [("accumulation=0", "parameters.accumulation"), ("rank=1000", "parameters.rank"),
     ("target_modules=q_proj,nope", "parameters.target_modules")],
)  # fmt: skip
def test_cli_refuses_bad_input_before_anything_starts(
    param: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["experiment", "training-stability", "--param", param, "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"loadlens experiment: error: training-stability.yaml: {field}: ") and err.count("\n") == 1
    assert not (tmp_path / "experiments").exists()


def test_the_runner_feeds_the_training_series(tmp_path: Path) -> None:
    from exporters.training.metrics import TrainingMetrics
    from loadlens.experiment.training.analysis import training_analyse
    from loadlens.experiment.training.runner import TrainingRunner
    from loadlens.experiment.training.spec import load_training

    exp = load_training(_write(tmp_path, "accumulation-sensitivity", {"accumulations": [2], "budget": 6}, repeats=1))
    metrics = TrainingMetrics()
    runner = TrainingRunner(exp, tmp_path / "x", "x", 1, load_slos(), say=lambda _: None, metrics=metrics)
    runner.prepare()
    runner.run(training_analyse(exp.spec.analysis))
    assert metrics.registry.get_sample_value("loadlens_training_step_total", {"run": "x/acc2/r1"}) == 3.0
    assert metrics.registry.get_sample_value("loadlens_training_accumulation_steps", {"run": "x/acc2/r1"}) == 2.0


def test_docs_name_every_figure_and_parameter() -> None:
    from dataclasses import fields

    from tests.support.paths import ROOT

    text = (ROOT / "docs" / "training.md").read_text()
    cfg = _tiny(steps=2)
    figures, _ = run_figures(cfg, train(cfg, run_name="docs"), load_slos())
    assert [k for k in figures if f"`{k}`" not in text] == []
    assert [f.name for f in fields(TrainConfig) if f"`{f.name}`" not in text and f.name != "seed"] == []


@pytest.mark.parametrize(("checkpointing", "calls"), [(False, 2), (True, 4)])
def test_gradient_checkpointing_recomputes_the_layers_in_backward(
    checkpointing: bool, calls: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers.models.llama import modeling_llama

    from loadlens.experiment.training.engine import build_model

    seen: list[bool] = []
    original = modeling_llama.LlamaMLP.forward

    def counted(self: Any, x: torch.Tensor) -> torch.Tensor:
        seen.append(True)
        return original(self, x)

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", counted)
    model = build_model(_tiny(gradient_checkpointing=checkpointing), torch.device("cpu"))
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=ids, labels=ids).loss
    assert len(seen) == 2  # one MLP per layer, 2 layers
    loss.backward()
    assert len(seen) == calls  # with checkpointing the backward runs each layer's forward again


def test_accumulation_lowers_the_grad_norm_spread_as_averaging_predicts(tmp_path: Path) -> None:
    """The gradient of an accumulation of k micro-batches is their mean: its variance from step to step falls
    about as 1/k, so the grad-norm spread of lora_A and lora_B must fall from 1 to 8 (one seed: deterministic)."""
    path = _write(tmp_path, "accumulation-sensitivity", {"accumulations": [1, 8], "budget": 64}, repeats=1)
    assert main(["experiment", str(path), "--results", str(tmp_path), "--run-id", "spread"]) == 0
    result = parse_experiment_result(json.loads((tmp_path / "experiments/spread/experiment_result.json").read_text()))
    one, eight = result.tables[0].rows
    assert (one["accumulation"], eight["accumulation"]) == (1, 8)
    for key in ("lora_a_grad_norm_std", "lora_b_grad_norm_std"):
        assert 0 < eight[key] < one[key], (key, one[key], eight[key])
