"""The LoRA training dashboard: loss and learning rate, gradient norm and its jumps, the checkpoint policy,
LoRA update correlation, VRAM per step, step timing, and the trainer's allocator from the probe.

Series: ``loadlens_training_*`` of exporters/training/metrics.py (docs/training.md) and the probe collector's
``loadlens_gpu_allocator_*{role="trainer"}`` (exporters/gpu/collectors/probe.py). Thresholds come from the
SLO file's ``training`` and ``gpu`` sections, baked in at generation time.
"""

from __future__ import annotations

from loadlens.contracts.ports import GPU_JOB, job_selector
from loadlens.contracts.slo import SLOConfig
from loadlens.dashboards.common import alerts_annotation
from loadlens.dashboards.model import Annotation, Dashboard, Panel, Row, Target, Threshold, Variable, increase, rate

# Training series are selected by name and run only, as the training alerts do: a run is scraped under
# whatever job its Prometheus gives it (the local stack's `loadlens-training`).
RUN = 'run=~"$run"'
# The trainer's allocator comes from the GPU exporter's probe collector, one series per (gpu, pid) with
# role="trainer"; `$instance` and `$gpu` narrow to one exporter and device.
TRAINER = f'{job_selector(GPU_JOB)}, role="trainer", instance=~"$instance", gpu=~"$gpu"'
TRAINER_ANY = f'{job_selector(GPU_JOB)}, role="trainer"'
SAVES = f'{RUN}, decision="save"'
THRESHOLD_DASHED = "^threshold .*"


def variables() -> tuple[Variable, ...]:
    return (
        # The step counter exists from the run's first moment (start_run creates it at 0).
        Variable("run", "Run", "label_values(loadlens_training_step_total, run)"),
        Variable(
            "instance",
            "GPU exporter",
            f"label_values(loadlens_gpu_allocator_reserved_bytes{{{TRAINER_ANY}}}, instance)",
        ),
        Variable(
            "gpu",
            "GPU",
            f'label_values(loadlens_gpu_allocator_reserved_bytes{{{TRAINER_ANY}, instance=~"$instance"}}, gpu)',
        ),
    )


def checkpoint_annotation() -> Annotation:
    save = increase("loadlens_training_checkpoint_decisions_total", SAVES)
    return Annotation("Checkpoint saves", f"sum by (run) ({save}) > 0", "checkpoint {{run}}", "green")


def dashboard(slos: SLOConfig) -> Dashboard:
    t, g = slos.training, slos.gpu
    factor = t["grad_norm_jump_factor"]
    progress = Row(
        "Loss and learning rate",
        (
            Panel(
                "Loss",
                "short",
                (Target(f"loadlens_training_loss{{{RUN}}}", "{{run}}"),),
                "Loss of the last optimiser step (a Trainer run: the mean over its logging interval).",
            ),
            Panel(
                "Learning rate",
                "short",
                (Target(f"loadlens_training_learning_rate{{{RUN}}}", "{{run}}"),),
                "Learning rate the last optimiser step used.",
                min=0,
            ),
        ),
    )
    grads = Row(
        "Gradient norm",
        (
            Panel(
                "Gradient L2 norm and EMA",
                "short",
                (
                    Target(f"loadlens_training_grad_norm{{{RUN}}}", "{{run}} norm"),
                    Target(f"loadlens_training_grad_norm_ema{{{RUN}}}", "{{run}} EMA"),
                    Target(
                        f"{factor:g} * loadlens_training_grad_norm_ema{{{RUN}}}",
                        f"threshold {{{{run}}}} {factor:g}× EMA",
                    ),
                ),
                f"Norm before clipping, its EMA (β 0.9) and {factor:g}× the EMA (training.grad_norm_jump_factor). "
                "A jump compares the norm with the EMA of the steps before it, so a spiking step also lifts this line.",
                min=0,
                dashed=THRESHOLD_DASHED,
            ),
            Panel(
                "Jump ratio (norm / previous EMA)",
                "short",
                (Target(f"loadlens_training_grad_norm_jump_ratio{{{RUN}}}", "{{run}}"),),
                f"g_t / ema_(t-1); above the line ({factor:g}) the step counts as a jump.",
                threshold=Threshold(factor),
                min=0,
            ),
            Panel(
                "Gradient-norm jumps",
                "short",
                (
                    Target(
                        f"sum by (run) ({increase('loadlens_training_grad_norm_jumps_total', RUN)})",
                        "{{run}} jumps",
                    ),
                ),
                "Steps whose jump ratio exceeded the factor, per rate interval (LoadlensTrainingGradNormJump).",
                threshold=Threshold(1),
                min=0,
            ),
        ),
    )
    checkpoints = Row(
        "Checkpoint policy",
        (
            Panel(
                "Gradient-norm variance",
                "short",
                (Target(f"loadlens_training_grad_norm_variance{{{RUN}}}", "{{run}} variance"),),
                f"Population variance of the last {int(t['checkpoint_window_steps'])} norms; on steps divisible by "
                f"{int(t.get('checkpoint_every_steps', 4))} the policy saves above the line "
                f"({t['checkpoint_grad_norm_variance']:g}, training.checkpoint_grad_norm_variance).",
                threshold=Threshold(t["checkpoint_grad_norm_variance"]),
                min=0,
            ),
            Panel(
                "Checkpoint decisions",
                "short",
                (
                    Target(
                        f"sum by (run, decision) ({increase('loadlens_training_checkpoint_decisions_total', RUN)})",
                        "{{run}} {{decision}}",
                    ),
                ),
                "Policy decisions (save, skip) per rate interval; absent when the run has no policy.",
                stack=True,
                min=0,
            ),
        ),
    )
    lora = Row(
        "LoRA updates",
        (
            Panel(
                "LoRA A/B update correlation",
                "short",
                (Target(f"loadlens_training_lora_ab_correlation{{{RUN}}}", "{{run}} {{module}}"),),
                "Per module, corr(vec ΔW_t, vec ΔW_(t-1)) with ΔW_t = B_t·A_t − B_(t-1)·A_(t-1); red below "
                f"{t['lora_ab_correlation_min']:g} (training.lora_ab_correlation_min).",
                threshold=Threshold(t["lora_ab_correlation_min"], color="green", base="red"),
                min=-1,
                max=1,
                width=24,
            ),
        ),
    )
    vram = Row(
        "VRAM per step",
        (
            Panel(
                "VRAM step peak",
                "bytes",
                (Target(f"loadlens_training_vram_step_peak_bytes{{{RUN}}}", "{{run}} peak"),),
                "torch.cuda.max_memory_allocated during the last step (CUDA runs only).",
                min=0,
            ),
            Panel(
                "VRAM peak fluctuation",
                "percentunit",
                (Target(f"loadlens_training_vram_peak_fluctuation_ratio{{{RUN}}}", "{{run}} (max − min) / mean"),),
                f"(max − min) / mean of the per-step peaks over the last {int(t['checkpoint_window_steps'])} steps; "
                f"line: {g['vram_fluctuation_ratio']:.0%} (gpu.vram_fluctuation_ratio).",
                threshold=Threshold(g["vram_fluctuation_ratio"]),
                min=0,
            ),
        ),
    )
    timing = Row(
        "Step timing",
        (
            Panel(
                "Step time",
                "s",
                (Target(f"loadlens_training_step_duration_seconds{{{RUN}}}", "{{run}}"),),
                "Wall time of the last optimiser step.",
                min=0,
                width=8,
            ),
            Panel(
                "Steps/s",
                "short",
                (Target(f"sum by (run) ({rate('loadlens_training_step_total', RUN)})", "{{run}}"),),
                "Optimiser steps per second over the rate interval.",
                min=0,
                width=8,
            ),
            Panel(
                "Accumulation steps",
                "short",
                (Target(f"loadlens_training_accumulation_steps{{{RUN}}}", "{{run}}"),),
                "Micro-batches (backward passes) in the last optimiser step.",
                min=0,
                width=8,
            ),
        ),
    )
    allocator = Row(
        "Trainer allocator (probe)",
        (
            Panel(
                "Trainer allocator memory",
                "bytes",
                (
                    Target(f"loadlens_gpu_allocator_reserved_bytes{{{TRAINER}}}", "gpu {{gpu}} pid {{pid}} reserved"),
                    Target(f"loadlens_gpu_allocator_allocated_bytes{{{TRAINER}}}", "gpu {{gpu}} pid {{pid}} allocated"),
                ),
                "The trainer process's caching allocator from its in-process probe: reserved segments and blocks "
                "handed out (needs the probe in the trainer and `gpu-exporter --probe-dir`).",
                min=0,
            ),
            Panel(
                "Trainer allocator fragmentation",
                "percentunit",
                (
                    Target(
                        f"loadlens_gpu_allocator_fragmentation_ratio{{{TRAINER}}}",
                        "gpu {{gpu}} pid {{pid}} 1 − largest free / free",
                    ),
                ),
                f"1 − largest free block / free bytes; line: {g['fragmentation_ratio']:.0%} (gpu.fragmentation_ratio).",
                threshold=Threshold(g["fragmentation_ratio"]),
                min=0,
                max=1,
            ),
        ),
    )
    return Dashboard(
        uid="loadlens-training",
        title="loadlens / LoRA training",
        description="Loss, learning rate, gradient norm and jumps, checkpoint policy, LoRA update correlation, "
        "VRAM per step, step timing and the trainer's allocator.",
        rows=(progress, grads, checkpoints, lora, vram, timing, allocator),
        variables=variables(),
        annotations=(checkpoint_annotation(), alerts_annotation()),
    )
