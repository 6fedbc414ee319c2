"""One training run's configuration (a trial's parameters, settings and swept value merged) and its checks,
made before anything starts: free of torch, so a bad value is refused in milliseconds with a one-line reason
naming the field (``parameters.rank: 80 is above the width of q_proj (64)``).

The model is a randomly initialised Llama built from a config (``MODEL_SIZES``); its linear layers and their
widths follow from the config alone (``layer_widths``), which is how ``target_modules`` and ``rank`` are
checked without building it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from loadlens.experiment.errors import ExperimentError

# name -> LlamaConfig fields. small: CPU default (a step in milliseconds); medium: the default on CUDA.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "small": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
    "medium": {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8},
}
Checkpoints = Literal["none", "fixed", "dynamic"]


@dataclass(frozen=True)
class TrainConfig:
    """Every key is a parameter of a training experiment (docs/experiments.md, *Training experiments*)."""

    steps: int = 200
    """Optimiser steps per run (the guide's 200-step window)."""
    budget: int = 0
    """When > 0, the run's optimiser steps are ``budget // accumulation`` (``steps`` is ignored): every
    accumulation setting sees the same number of micro-batches."""
    micro_batch: int = 8
    """Sequences per micro-batch (one forward/backward)."""
    accumulation: int = 1
    """Micro-batches per optimiser step (the loss of each is divided by it)."""
    seq_len: int = 32
    vocab: int = 64
    model: str = "auto"
    """``small`` / ``medium`` (MODEL_SIZES) or ``auto``: small on CPU, medium on CUDA."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    lr: float = 2e-3
    """AdamW learning rate (constant; weight decay 0)."""
    max_grad_norm: float = 1.0
    """Clip the gradient's L2 norm to this before the step (0: no clipping); telemetry sees the norm before."""
    lora: bool = True
    """PEFT LoRA on ``target_modules`` (base frozen); false: every weight is trained (full fine-tuning)."""
    rank: int = 8
    alpha: float = 16.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    train_head: bool = True
    """With LoRA, also train the LM head (PEFT ``modules_to_save``): adapters on q/v alone of a *randomly
    initialised* base cannot learn the corpus (validation loss 4.05 -> 3.44 in 200 steps, docs/training.md)."""
    gradient_checkpointing: bool = True
    """transformers' gradient checkpointing with ``use_reentrant=False``."""
    checkpoints: Checkpoints = "fixed"
    """When a checkpoint is saved: ``fixed`` every ``save_every`` steps, ``dynamic`` when the guide's rule
    says so, ``none`` never. Saving writes the trainable weights; it changes nothing in the optimisation."""
    save_every: int = 50
    eval_every: int = 5
    """Steps between validation-loss evaluations (and the last step)."""
    val_sequences: int = 64
    smoothing: int = 3
    """The smoothed validation loss is the mean of the last ``smoothing`` evaluations."""
    target_loss: float = 2.0
    """Convergence: the first evaluation step whose smoothed validation loss is <= this (nats)."""
    divergence_ratio: float = 1.5
    divergence_window: int = 4
    """Divergence: the mean training loss of the last ``divergence_window`` steps exceeds ``divergence_ratio``
    x the first step's loss."""
    spike_step: int = 0
    spike_factor: float = 1.0
    spike_steps: int = 1
    """A learning-rate spike: steps spike_step .. spike_step + spike_steps - 1 run at lr x spike_factor (0: off)."""
    measure_from: float = 0.5
    """Grad-norm spread (std) is taken over the steps after this fraction of the run."""
    corpus_seed: int = 0
    seed: int = 0
    """The run's seed (model initialisation, batch order): seed_base + repeat - 1, set by the runner."""

    @property
    def total_steps(self) -> int:
        return self.budget // self.accumulation if self.budget > 0 else self.steps

    def model_fields(self, cuda: bool) -> dict[str, int]:
        size = self.model if self.model != "auto" else ("medium" if cuda else "small")
        return {**MODEL_SIZES[size], "vocab_size": self.vocab, "max_position_embeddings": self.seq_len}


KEYS = {f.name: f for f in dataclasses.fields(TrainConfig)}
RUNNER_KEYS = ("seed_base",)
"""Parameters the runner uses itself (the run's seed is seed_base + repeat - 1)."""


def layer_widths(fields: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Llama's linear layers by their module name -> (in features, out features) (key/value heads = heads)."""
    h, i = fields["hidden_size"], fields["intermediate_size"]
    return {
        "q_proj": (h, h), "k_proj": (h, h), "v_proj": (h, h), "o_proj": (h, h),
        "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
    }  # fmt: skip


def _typed(key: str, value: Any, where: str) -> Any:
    f = KEYS[key]
    default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ExperimentError(f"{where}: must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ExperimentError(f"{where}: must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ExperimentError(f"{where}: must be a number, got {value!r}")
        return float(value)
    if isinstance(default, list):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or not value:
            raise ExperimentError(f"{where}: must be a non-empty list of module names, got {value!r}")
        return list(value)
    if not isinstance(value, str):
        raise ExperimentError(f"{where}: must be a string, got {value!r}")
    return value


def build_config(values: dict[str, Any], where: dict[str, str]) -> TrainConfig:
    """A run's configuration from merged values; ``where[key]`` names the field a value came from (for the
    message). Raises :class:`ExperimentError` naming the first bad field."""
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key in KEYS:
            kwargs[key] = _typed(key, value, where.get(key, key))
    cfg = TrainConfig(**kwargs)
    check(cfg, where)
    return cfg


def check(cfg: TrainConfig, where: dict[str, str]) -> None:
    def bad(key: str, why: str) -> ExperimentError:
        return ExperimentError(f"{where.get(key, key)}: {why}")

    for key in ("steps", "micro_batch", "accumulation", "seq_len", "eval_every", "val_sequences", "smoothing",
                "save_every", "divergence_window", "spike_steps", "rank"):  # fmt: skip
        if getattr(cfg, key) < 1:
            raise bad(key, f"must be >= 1, got {getattr(cfg, key)}")
    if cfg.budget < 0 or (cfg.budget > 0 and cfg.total_steps < 1):
        raise bad("budget", f"must give at least one step (budget // accumulation >= 1), got {cfg.budget}")
    if cfg.seq_len < 2:
        raise bad("seq_len", f"must be >= 2, got {cfg.seq_len}")
    if cfg.vocab < 8:
        raise bad("vocab", f"must be >= 8, got {cfg.vocab}")
    for key in ("lr", "alpha", "divergence_ratio", "spike_factor", "target_loss"):
        if not getattr(cfg, key) > 0:
            raise bad(key, f"must be > 0, got {getattr(cfg, key)}")
    if cfg.max_grad_norm < 0 or cfg.spike_step < 0:
        raise bad("max_grad_norm" if cfg.max_grad_norm < 0 else "spike_step", "must be >= 0")
    if not 0 <= cfg.measure_from < 1:
        raise bad("measure_from", f"must be in [0, 1), got {cfg.measure_from}")
    if cfg.model not in (*MODEL_SIZES, "auto"):
        raise bad("model", f"unknown model size {cfg.model!r} (have auto, {', '.join(MODEL_SIZES)})")
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise bad("device", f"must be auto, cpu or cuda, got {cfg.device!r}")
    if cfg.checkpoints not in ("none", "fixed", "dynamic"):
        raise bad("checkpoints", f"must be none, fixed or dynamic, got {cfg.checkpoints!r}")
    if cfg.lora:
        for cuda in (False, True) if cfg.model == "auto" else (False,):
            widths = layer_widths(cfg.model_fields(cuda))
            for module in cfg.target_modules:
                if module not in widths:
                    raise bad("target_modules", f"unknown module {module!r} (the model has {', '.join(widths)})")
                width = min(widths[module])
                if cfg.rank > width:
                    size = cfg.model if cfg.model != "auto" else ("medium" if cuda else "small")
                    raise bad("rank", f"{cfg.rank} is above the width of {module} ({width}, model {size})")
