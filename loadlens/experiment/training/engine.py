"""One training run (imports torch, transformers, peft): a randomly initialised Llama built from a config,
PEFT LoRA or full fine-tuning, transformers' gradient checkpointing with ``use_reentrant=False``, AdamW, the
Markov corpus (corpus.py), and the training telemetry of ``exporters.training`` (the hook: gradient norm, its
EMA and jumps, the checkpoint policy, LoRA update correlation, CUDA allocator peaks and the in-process probe)
on every optimiser step. The device is the only switch between CPU and CUDA.

Usage::

    record = train(cfg, run_name="gc-lora/r1", checkpoint_dir=Path("ckpt"))
    record.crash, record.steps, record.evals          # definitions.py turns them into figures
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from exporters.training.hook import TrainingTelemetry
from exporters.training.maths import CheckpointPolicy
from exporters.training.metrics import TrainingMetrics
from loadlens.contracts.slo import SLOConfig, load_slos
from loadlens.experiment.training.config import TrainConfig
from loadlens.experiment.training.corpus import MarkovChain
from loadlens.experiment.training.definitions import Crash, crash_after_step


@dataclass
class StepRecord:
    step: int
    loss: float
    lr: float
    grad_norm: float | None
    grad_norm_lora_a: float | None
    grad_norm_lora_b: float | None
    jump_ratio: float | None
    jump: bool
    grad_norm_variance: float | None
    decision: str | None
    """The dynamic rule's decision on this step (``save``/``skip``), None off its decision steps."""
    saved: bool
    ab_correlation: dict[str, float]
    memory_bytes: float | None
    """CUDA: the allocator's peak allocated bytes during the step; CPU: the process's resident set after it."""
    seconds: float


@dataclass
class RunRecord:
    device: str
    memory_source: str
    """``cuda_allocator_peak`` or ``process_rss``."""
    model: dict[str, int]
    trainable_parameters: int
    gradient_checkpointing: bool
    loss_floor: float
    steps: list[StepRecord] = field(default_factory=list)
    evals: list[tuple[int, float]] = field(default_factory=list)
    """(step, validation loss) after every ``eval_every`` steps and the last one."""
    crash: Crash | None = None
    checkpoint_seconds: float = 0.0
    seconds: float = 0.0


def pick_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def build_model(cfg: TrainConfig, device: torch.device) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    fields: dict[str, Any] = dict(cfg.model_fields(device.type == "cuda"))
    config = LlamaConfig(**fields, num_key_value_heads=fields["num_attention_heads"], use_cache=False)
    model: Any = LlamaForCausalLM(config)
    if cfg.gradient_checkpointing:
        with warnings.catch_warnings():  # transformers >= 5.x renames it activation_checkpointing_enable: theirs
            warnings.filterwarnings("ignore", "`gradient_checkpointing_enable` is deprecated", FutureWarning)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora:
        lora = LoraConfig(
            r=cfg.rank,
            lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # peft annotates int; a float works
            target_modules=list(cfg.target_modules),
            lora_dropout=0.0,
            modules_to_save=["lm_head"] if cfg.train_head else None,
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            model = get_peft_model(model, lora)
    model.to(device)
    model.train()
    return model


def _rss_bytes() -> float | None:
    try:
        with open("/proc/self/statm") as f:
            return float(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _group_norm(params: list[torch.Tensor]) -> float | None:
    grads = [p.grad.detach().float().pow(2).sum() for p in params if p.grad is not None]
    return math.sqrt(float(torch.stack(grads).sum())) if grads else None


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


@torch.no_grad()
def validation_loss(model: Any, val: torch.Tensor, micro_batch: int) -> float:
    model.eval()
    total, n = 0.0, 0
    for lo in range(0, val.shape[0], micro_batch):
        ids = val[lo : lo + micro_batch]
        total += float(model(input_ids=ids, labels=ids).loss) * ids.shape[0]
        n += ids.shape[0]
    model.train()
    return total / n


def train(cfg: TrainConfig, **kwargs: Any) -> RunRecord:
    """Train one run; a crash (crash_after_step, or an out-of-memory error) ends it early and is recorded."""
    with warnings.catch_warnings():
        # peft and the checkpointing path read transformers' deprecated is_gradient_checkpointing: theirs.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        return _train(cfg, **kwargs)


def _train(
    cfg: TrainConfig,
    *,
    run_name: str,
    checkpoint_dir: Path | None = None,
    slos: SLOConfig | None = None,
    metrics: TrainingMetrics | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
) -> RunRecord:
    slos = slos if slos is not None else load_slos()
    device = pick_device(cfg)
    chain = MarkovChain.make(cfg.vocab, cfg.corpus_seed)
    val = chain.sample(cfg.val_sequences, cfg.seq_len, torch.Generator().manual_seed(cfg.corpus_seed + 1_000_003))
    val = val.to(device)
    data = torch.Generator().manual_seed(cfg.seed * 7919 + cfg.corpus_seed + 1)
    model = build_model(cfg, device)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    lora_a = [p for n, p in trainable if ".lora_A." in n]
    lora_b = [p for n, p in trainable if ".lora_B." in n]
    optimizer = torch.optim.AdamW([p for _, p in trainable], lr=cfg.lr, weight_decay=0.0)
    policy = CheckpointPolicy.from_slos(slos) if cfg.checkpoints == "dynamic" else None
    telemetry = TrainingTelemetry(run_name, metrics, slos=slos, policy=policy, lora=cfg.lora)
    cuda = device.type == "cuda"
    record = RunRecord(
        device=str(device) if not cuda else torch.cuda.get_device_name(device),
        memory_source="cuda_allocator_peak" if cuda else "process_rss",
        model=cfg.model_fields(cuda),
        trainable_parameters=sum(p.numel() for _, p in trainable),
        gradient_checkpointing=bool(getattr(model, "is_gradient_checkpointing", False))
        or bool(getattr(getattr(model, "base_model", None), "is_gradient_checkpointing", False)),
        loss_floor=chain.entropy_nats,
    )
    started = time.perf_counter()
    telemetry.attach(model)
    try:
        for step in range(1, cfg.total_steps + 1):
            spiking = cfg.spike_step > 0 and cfg.spike_step <= step < cfg.spike_step + cfg.spike_steps
            lr = cfg.lr * (cfg.spike_factor if spiking else 1.0)
            for group in optimizer.param_groups:
                group["lr"] = lr
            telemetry.step_begin()
            loss_sum = 0.0
            try:
                for _ in range(cfg.accumulation):
                    ids = chain.sample(cfg.micro_batch, cfg.seq_len, data).to(device)
                    loss = model(input_ids=ids, labels=ids).loss / cfg.accumulation
                    loss.backward()
                    loss_sum += float(loss.detach())
            except RuntimeError as err:
                if not _is_oom(err):
                    raise
                record.crash = Crash(step, "oom", str(err).splitlines()[0][:200])
                break
            a_norm, b_norm = _group_norm(lora_a), _group_norm(lora_b)
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_([p for _, p in trainable], cfg.max_grad_norm)
            optimizer.step()
            report = telemetry.after_step(loss=loss_sum, lr=lr, step=step)
            optimizer.zero_grad(set_to_none=True)
            memory = float(report.vram_peak_bytes) if report.vram_peak_bytes is not None else _rss_bytes()
            if cfg.checkpoints == "dynamic":
                save = report.decision is not None and report.decision.save
            else:
                save = cfg.checkpoints == "fixed" and step % cfg.save_every == 0
            if save and checkpoint_dir is not None:
                t0 = time.perf_counter()
                checkpoint_dir.mkdir(parents=True, exist_ok=True)
                state = {n: p.detach().cpu() for n, p in trainable}
                torch.save({"step": step, "weights": state}, checkpoint_dir / "last.pt")
                record.checkpoint_seconds += time.perf_counter() - t0
            rec = StepRecord(
                step, loss_sum, lr, report.grad_norm, a_norm, b_norm, report.jump_ratio, report.jump,
                report.grad_norm_variance,
                None if report.decision is None else ("save" if report.decision.save else "skip"),
                save, dict(report.ab_correlation), memory, report.step_seconds,
            )  # fmt: skip
            record.steps.append(rec)
            if on_step is not None:
                on_step(rec)
            record.crash = crash_after_step([s.loss for s in record.steps], cfg.divergence_ratio, cfg.divergence_window)
            if record.crash is not None:
                break
            if step % cfg.eval_every == 0 or step == cfg.total_steps:
                record.evals.append((step, validation_loss(model, val, cfg.micro_batch)))
    finally:
        telemetry.detach()
    record.seconds = time.perf_counter() - started
    return record
