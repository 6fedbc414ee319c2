"""`make train-demo`: LoRA fine-tuning of a tiny random causal LM on CPU, scraped as ``loadlens-training``.

A ``transformers.Trainer`` runs ``--steps`` optimiser steps on synthetic tokens with ``LoadlensCallback``,
serving /metrics on ``--port`` (the local stack scrapes it). At ``--spike-step`` the learning rate is
multiplied by ``--spike-factor`` for one step; the LM head (trained beside the q/v adapters) it throws off
makes the next steps' gradient norm jump above 3x its EMA (about 10x here), so ``LoadlensTrainingGradNormJump``
fires and reaches the pager. ``--step-seconds``
paces the steps so a 1 s scrape sees them; ``--linger`` keeps /metrics up after the last step.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from exporters.training.hook import TrainingTelemetry
from exporters.training.maths import CheckpointPolicy
from exporters.training.metrics import TrainingMetrics, serve
from loadlens.contracts.ports import PORT


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m exporters.training.demo", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--spike-step", type=int, default=30, help="step whose learning rate is spiked (0: none)")
    p.add_argument("--spike-factor", type=float, default=100.0)
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--step-seconds", type=float, default=0.3, help="minimum wall time per step")
    p.add_argument("--linger", type=float, default=10.0, help="seconds /metrics stays up after training")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=PORT["training"])
    p.add_argument("--run", default="train-demo")
    p.add_argument("--output-dir", default=".run/train-demo")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from exporters.training.callback import LoadlensCallback
    from exporters.training.tiny import synthetic_examples, tiny_lora_model

    class Pace(TrainerCallback):
        """Stretch each step to ``--step-seconds`` so the scrape interval sees the run step by step."""

        def __init__(self) -> None:
            self.t = time.monotonic()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(max(0.0, a.step_seconds - (time.monotonic() - self.t)))
            self.t = time.monotonic()

    metrics = TrainingMetrics()
    server = serve(metrics, a.host, a.port)
    print(f"train-demo: /metrics on {server.url}/metrics, run {a.run}, {a.steps} steps", flush=True)
    telemetry = TrainingTelemetry(a.run, metrics, policy=CheckpointPolicy())
    model = tiny_lora_model(train_head=True)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=a.lr, momentum=0.9)
    # Scheduler step i sets the rate of step i + 1: the factor lands on exactly --spike-step.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: a.spike_factor if a.spike_step and i + 1 == a.spike_step else 1.0
    )
    args = TrainingArguments(
        output_dir=a.output_dir, max_steps=a.steps, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
        max_grad_norm=1.0,
    )  # fmt: skip
    callback = LoadlensCallback(telemetry)
    trainer = Trainer(
        model=model, args=args, train_dataset=synthetic_examples(a.steps * 8), optimizers=(optimizer, schedule),
        callbacks=[callback, Pace()],
    )  # fmt: skip
    trainer.train()
    jumps = [r.step for r in callback.reports if r.jump]
    print(f"train-demo: done; steps with a jump: {jumps}", flush=True)
    time.sleep(a.linger)
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
