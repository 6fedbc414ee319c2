"""The plain-PyTorch hook: ``TrainingTelemetry`` turns a training loop's steps into the training series.

Use in a hand-written loop::

    telemetry = TrainingTelemetry("my-run").attach(model)
    for batch in batches:
        for micro in split(batch):
            model(**micro).loss.backward()          # gradient hooks record the norm, before any clipping
        clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        report = telemetry.after_step(loss=loss.item(), lr=scheduler.get_last_lr()[0])
        optimizer.zero_grad()
        if report.decision and report.decision.save: save(...)

The gradient L2 norm comes from ``register_post_accumulate_grad_hook`` on every trainable parameter: the
last call of each hook before ``after_step`` holds the fully accumulated gradient, before clipping (the
Trainer clips before any callback sees the gradients, and a clipped norm can never show a jump).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from exporters.probe import Probe, start_probe
from exporters.training.maths import CheckpointPolicy, Decision, Ema, Window, jump_ratio
from exporters.training.metrics import TrainingMetrics
from loadlens.contracts.slo import SLOConfig, load_slos


@dataclass(frozen=True)
class StepReport:
    step: int
    grad_norm: float | None
    grad_norm_ema: float | None
    jump_ratio: float | None
    jump: bool
    grad_norm_variance: float | None
    micro_batches: int
    step_seconds: float
    vram_peak_bytes: int | None
    vram_fluctuation: float | None
    ab_correlation: dict[str, float] = field(default_factory=dict)
    decision: Decision | None = None


def _lora_pairs(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """PEFT LoRA layers: module name -> (A weight r x in, B weight out x r), one entry per adapter."""
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, module in model.named_modules():
        lora_a, lora_b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
        if not isinstance(lora_a, torch.nn.ModuleDict) or not isinstance(lora_b, torch.nn.ModuleDict):
            continue
        label = name.removeprefix("base_model.model.")
        for adapter in lora_a:
            if adapter in lora_b:
                key = label if adapter == "default" else f"{label}[{adapter}]"
                a, b = lora_a[adapter].weight, lora_b[adapter].weight
                if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                    pairs[key] = (a, b)
    return pairs


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float | None:
    x = x.flatten().double()
    y = y.flatten().double()
    x, y = x - x.mean(), y - y.mean()
    denom = math.sqrt(float((x * x).sum()) * float((y * y).sum()))
    return float((x * y).sum()) / denom if denom > 0.0 else None


class LoraUpdateTracker:
    """Per module, ``corr(vec dW_t, vec dW_(t-1))`` with ``dW_t = B_t A_t - B_(t-1) A_(t-1)``.

    Keeps two out x in matrices per module (the last product and the last update): cheap for the q/v
    projections LoRA targets, and computed without gradients.
    """

    def __init__(self, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.pairs = pairs
        self._product: dict[str, torch.Tensor] = {}
        self._update: dict[str, torch.Tensor] = {}
        self.snapshot()

    @torch.no_grad()
    def _products(self) -> dict[str, torch.Tensor]:
        return {name: (b.detach().float() @ a.detach().float()) for name, (a, b) in self.pairs.items()}

    def snapshot(self) -> None:
        self._product = self._products()
        self._update = {}

    @torch.no_grad()
    def step(self) -> dict[str, float]:
        """After an optimiser step: the correlation of each module whose last two updates are both non-zero."""
        out: dict[str, float] = {}
        for name, product in self._products().items():
            update = product - self._product[name]
            previous = self._update.get(name)
            if previous is not None:
                r = _pearson(update, previous)
                if r is not None:
                    out[name] = r
            self._product[name], self._update[name] = product, update
        return out


class TrainingTelemetry:
    def __init__(
        self,
        run: str,
        metrics: TrainingMetrics | None = None,
        *,
        slos: SLOConfig | None = None,
        ema_beta: float = 0.9,
        window_steps: int | None = None,
        policy: CheckpointPolicy | None = None,
        lora: bool = True,
        probe: bool = True,
    ) -> None:
        slos = slos if slos is not None else load_slos()
        self.run = run
        self.metrics = metrics if metrics is not None else TrainingMetrics()
        self.jump_factor = slos.training["grad_norm_jump_factor"]
        n = window_steps if window_steps is not None else int(slos.training["checkpoint_window_steps"])
        self.ema = Ema(ema_beta)
        self.norms = Window(n)
        self.vram_peaks = Window(n)
        self.policy = policy
        self.lora = lora
        self.step = 0
        self.micro_batches = 0
        self._sq: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []
        self._tracker: LoraUpdateTracker | None = None
        self._device: torch.device | None = None
        self._t0 = time.perf_counter()
        self.metrics.start_run(run, policy=policy is not None)
        self._use_probe = probe
        self._probe: Probe | None = None

    # --- wiring -----------------------------------------------------------------------------------------

    def attach(self, model: torch.nn.Module) -> TrainingTelemetry:
        """Hook every trainable parameter and snapshot the LoRA products; returns self."""
        self.detach()
        params = [p for p in model.parameters() if p.requires_grad]
        for i, p in enumerate(params):
            hook = p.register_post_accumulate_grad_hook(self._grad_hook(i == 0))  # type: ignore[no-untyped-call]
            self._handles.append(hook)
        if params and params[0].is_cuda:
            self._device = params[0].device
            torch.cuda.reset_peak_memory_stats(self._device)
            if self._use_probe and self._probe is None:
                # The allocator as only this process sees it, published for the GPU exporter
                # (LOADLENS_PROBE_DIR; None, with one log line, when unset): docs/probe-documents.md.
                self._probe = start_probe("trainer", torch=torch)
        if self.lora:
            pairs = _lora_pairs(model)
            self._tracker = LoraUpdateTracker(pairs) if pairs else None
        self._t0 = time.perf_counter()
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._probe is not None:
            self._probe.stop()
            self._probe = None

    def _grad_hook(self, counts_backward: bool) -> Any:
        def hook(p: torch.Tensor) -> None:
            if p.grad is not None:
                # Kept on the device; summed once per optimiser step (one host sync per step, not per tensor).
                self._sq[id(p)] = p.grad.detach().float().pow(2).sum()
            if counts_backward:
                self.micro_batches += 1

        return hook

    # --- per step ---------------------------------------------------------------------------------------

    def step_begin(self) -> None:
        """Optional: mark the start of a step (otherwise a step lasts from the end of the previous one)."""
        self._t0 = time.perf_counter()

    def after_step(self, *, loss: float | None = None, lr: float | None = None, step: int | None = None) -> StepReport:
        """Call once after each ``optimizer.step()`` and before ``zero_grad()``."""
        m, run = self.metrics, self.run
        self.step = step if step is not None else self.step + 1
        now = time.perf_counter()
        seconds, self._t0 = now - self._t0, now
        norm = math.sqrt(float(torch.stack(list(self._sq.values())).sum())) if self._sq else None
        micro, self.micro_batches, self._sq = self.micro_batches, 0, {}

        ema = ratio = variance = None
        jump = False
        decision: Decision | None = None
        if norm is not None:
            ratio = jump_ratio(norm, self.ema.value)
            ema = self.ema.update(norm)
            self.norms.add(norm)
            variance = self.norms.variance()
            jump = ratio is not None and ratio > self.jump_factor
            m.grad_norm.labels(run).set(norm)
            m.grad_norm_ema.labels(run).set(ema)
            if ratio is not None:
                m.jump_ratio.labels(run).set(ratio)
            if jump:
                m.jumps.labels(run).inc()
            if variance is not None:
                m.grad_norm_variance.labels(run).set(variance)
            if self.policy is not None:
                decision = self.policy.observe(self.step, norm)
                if decision is not None:
                    m.checkpoints.labels(run, "save" if decision.save else "skip").inc()

        peak = fluctuation = None
        if self._device is not None:
            peak = int(torch.cuda.max_memory_allocated(self._device))
            torch.cuda.reset_peak_memory_stats(self._device)
            self.vram_peaks.add(float(peak))
            fluctuation = self.vram_peaks.fluctuation()
            m.vram_step_peak.labels(run).set(peak)
            if fluctuation is not None:
                m.vram_fluctuation.labels(run).set(fluctuation)

        correlations = self._tracker.step() if self._tracker is not None else {}
        for module, r in correlations.items():
            m.ab_correlation.labels(run, module).set(r)

        if loss is not None:
            m.loss.labels(run).set(loss)
        if lr is not None:
            m.learning_rate.labels(run).set(lr)
        m.steps.labels(run).inc()
        m.step_duration.labels(run).set(seconds)
        m.accumulation.labels(run).set(micro)
        return StepReport(
            self.step, norm, ema, ratio, jump, variance, micro, seconds, peak, fluctuation, correlations, decision
        )
