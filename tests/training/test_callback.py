"""The TrainerCallback inside a real transformers.Trainer run on the tiny LoRA model (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import required

required.require_module("transformers")  # the training extra (make venv installs it)
required.require_module("peft")

from transformers import Trainer, TrainingArguments  # noqa: E402

from exporters.training.callback import LoadlensCallback  # noqa: E402
from exporters.training.hook import TrainingTelemetry  # noqa: E402
from exporters.training.maths import CheckpointPolicy  # noqa: E402
from exporters.training.tiny import synthetic_examples, tiny_lora_model  # noqa: E402


def _train(tmp_path: Path, threshold: float, steps: int = 12) -> tuple[LoadlensCallback, Trainer]:
    telemetry = TrainingTelemetry("hf", policy=CheckpointPolicy(variance_threshold=threshold))
    callback = LoadlensCallback(telemetry, apply_checkpoint_policy=True)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        max_grad_norm=0.05,  # clipping on: the callback must still see the norm before it
        logging_steps=1,
        save_strategy="no",  # only the policy saves
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=tiny_lora_model(), args=args, train_dataset=synthetic_examples(steps * 4),
                      callbacks=[callback])  # fmt: skip
    trainer.train()
    return callback, trainer


def test_callback_exports_every_step_and_matches_the_trainer(tmp_path: Path) -> None:
    callback, trainer = _train(tmp_path, threshold=0.0)
    reg = callback.telemetry.metrics.registry
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]
    assert [r.step for r in callback.reports] == list(range(1, 13))
    assert [r.micro_batches for r in callback.reports] == [2] * 12
    # The Trainer logs the norm before clipping; ours must be the same number, step by step.
    assert [r.grad_norm for r in callback.reports] == pytest.approx([h["grad_norm"] for h in logged], rel=1e-4)
    assert reg.get_sample_value("loadlens_training_step_total", {"run": "hf"}) == 12
    assert reg.get_sample_value("loadlens_training_accumulation_steps", {"run": "hf"}) == 2
    assert reg.get_sample_value("loadlens_training_loss", {"run": "hf"}) == pytest.approx(logged[-1]["loss"])
    assert reg.get_sample_value("loadlens_training_learning_rate", {"run": "hf"}) == pytest.approx(
        logged[-1]["learning_rate"]
    )
    # Threshold 0: step 4 has no full window of 8 (skip), steps 8 and 12 do (save), and the Trainer saved.
    assert callback.saves_requested == [8, 12]
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-12", "checkpoint-8"]
    assert reg.get_sample_value("loadlens_training_checkpoint_decisions_total", {"run": "hf", "decision": "save"}) == 2
    assert reg.get_sample_value("loadlens_training_checkpoint_decisions_total", {"run": "hf", "decision": "skip"}) == 1
    modules = {s.labels["module"] for m in reg.collect() for s in m.samples
               if m.name == "loadlens_training_lora_ab_correlation"}  # fmt: skip
    assert len(modules) == 4


def test_a_calm_run_saves_nothing(tmp_path: Path) -> None:
    callback, _ = _train(tmp_path, threshold=1e9, steps=8)
    assert callback.saves_requested == []
    assert not list((tmp_path / "out").glob("checkpoint-*"))
    reg = callback.telemetry.metrics.registry
    assert reg.get_sample_value("loadlens_training_checkpoint_decisions_total", {"run": "hf", "decision": "skip"}) == 2
