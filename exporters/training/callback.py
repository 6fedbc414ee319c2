"""``LoadlensCallback``: the training series from a ``transformers.Trainer`` run (imports transformers).

It drives a ``TrainingTelemetry``: attaches it to the model at train begin, calls ``after_step`` on every
optimiser step with the Trainer's step number and learning rate, and sets the loss from the Trainer's logs
(the Trainer hands callbacks no per-step loss: set ``logging_steps=1`` for one value per step, otherwise it
is the mean over the logging interval). With ``apply_checkpoint_policy`` the guide's checkpoint rule asks
the Trainer to save (``control.should_save``) on the steps it decides to.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from exporters.training.hook import StepReport, TrainingTelemetry


class LoadlensCallback(TrainerCallback):
    def __init__(self, telemetry: TrainingTelemetry, *, apply_checkpoint_policy: bool = False) -> None:
        if apply_checkpoint_policy and telemetry.policy is None:
            raise ValueError("apply_checkpoint_policy needs a TrainingTelemetry with a policy")
        self.telemetry = telemetry
        self.apply_checkpoint_policy = apply_checkpoint_policy
        self.reports: list[StepReport] = []
        self.saves_requested: list[int] = []
        self._lr: float | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        model = kwargs.get("model")
        if model is not None:
            self.telemetry.attach(model)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.telemetry.step_begin()

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # Read here, before the scheduler steps: the rate this step used (on_step_end sees the next one).
        self._lr = _learning_rate(kwargs)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        report = self.telemetry.after_step(lr=self._lr, step=state.global_step)
        self.reports.append(report)
        if self.apply_checkpoint_policy and report.decision is not None and report.decision.save:
            control.should_save = True
            self.saves_requested.append(report.step)
        return control

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs and "loss" in logs:
            self.telemetry.metrics.loss.labels(self.telemetry.run).set(float(logs["loss"]))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.telemetry.detach()


def _learning_rate(kwargs: dict[str, Any]) -> float | None:
    optimizer = kwargs.get("optimizer")
    groups = getattr(optimizer, "param_groups", None)
    if groups:
        return float(groups[0]["lr"])
    return None
