"""The plain-PyTorch hook in a hand-written loop on a real tiny LoRA model (CPU)."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry

from exporters.training.hook import LoraUpdateTracker, TrainingTelemetry
from exporters.training.maths import CheckpointPolicy
from exporters.training.tiny import synthetic_batches, tiny_lora_model


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    v = registry.get_sample_value(name, labels)
    return None if v is None else float(v)


def test_hand_written_loop_with_accumulation_and_clipping() -> None:
    model = tiny_lora_model(seed=1)
    telemetry = TrainingTelemetry("loop", policy=CheckpointPolicy(variance_threshold=0.0)).attach(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    batches = synthetic_batches(8 * 3, batch_size=2, seed=1)
    reference_norms, reports = [], []
    for step in range(8):
        for micro in batches[step * 3 : step * 3 + 3]:  # 3 micro-batches per optimiser step
            (model(**micro).loss / 3).backward()
        # clip_grad_norm_ returns the norm before clipping: what the hook must have seen.
        reference_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)))
        opt.step()
        lr = 1e-3 if step < 7 else 0.5  # the last step's rate shows up in the gauge
        reports.append(telemetry.after_step(loss=1.5 + step, lr=lr))
        opt.zero_grad()
    telemetry.detach()
    reg = telemetry.metrics.registry

    assert [r.step for r in reports] == list(range(1, 9))
    assert [r.micro_batches for r in reports] == [3] * 8
    assert [r.grad_norm for r in reports] == pytest.approx(reference_norms, rel=1e-5)
    ema = reference_norms[0]
    for i, r in enumerate(reports):
        if i:
            assert r.jump_ratio == pytest.approx(reference_norms[i] / ema, rel=1e-5)
            ema = 0.9 * ema + 0.1 * reference_norms[i]
        assert r.grad_norm_ema == pytest.approx(ema, rel=1e-5)
    assert reports[0].jump_ratio is None and not any(r.jump for r in reports)
    # Threshold 0: step 4 has no full window (skip), step 8 has (save).
    assert [(r.step, r.decision.save) for r in reports if r.decision] == [(4, False), (8, True)]
    assert _value(reg, "loadlens_training_step_total", run="loop") == 8
    assert _value(reg, "loadlens_training_accumulation_steps", run="loop") == 3
    assert _value(reg, "loadlens_training_grad_norm", run="loop") == pytest.approx(reference_norms[-1], rel=1e-5)
    assert _value(reg, "loadlens_training_grad_norm_ema", run="loop") == pytest.approx(ema, rel=1e-5)
    assert _value(reg, "loadlens_training_loss", run="loop") == 8.5
    assert _value(reg, "loadlens_training_learning_rate", run="loop") == 0.5
    assert _value(reg, "loadlens_training_checkpoint_decisions_total", run="loop", decision="save") == 1
    assert _value(reg, "loadlens_training_checkpoint_decisions_total", run="loop", decision="skip") == 1
    assert _value(reg, "loadlens_training_grad_norm_jumps_total", run="loop") == 0
    # 2 layers x (q_proj, v_proj), from step 2 on; no CUDA here, so no VRAM series.
    modules = {m for r in reports[1:] for m in r.ab_correlation}
    assert modules == {f"model.layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in ("q", "v")}
    assert reports[0].ab_correlation == {}
    assert all(-1.0 <= v <= 1.0 for r in reports for v in r.ab_correlation.values())
    assert _value(reg, "loadlens_training_vram_peak_fluctuation_ratio", run="loop") is None


def test_a_spike_counts_one_jump() -> None:
    telemetry = TrainingTelemetry("spike", lora=False)
    w = torch.nn.Parameter(torch.zeros(4))
    telemetry.attach(torch.nn.ParameterList([w]))
    for scale in (1.0, 1.0, 1.0, 3.5, 1.0):
        (w * torch.full((4,), scale / 2)).sum().backward()  # gradient [s/2]*4: L2 norm = s
        report = telemetry.after_step()
        w.grad = None
    assert report.step == 5
    reg = telemetry.metrics.registry
    assert _value(reg, "loadlens_training_grad_norm_jumps_total", run="spike") == 1
    # Step 4: norm 3.5 over EMA 1.0 (ratio 3.5 > 3); step 5: 1.0 over 0.9 + 0.35 = 1.25.
    assert _value(reg, "loadlens_training_grad_norm_jump_ratio", run="spike") == pytest.approx(0.8)


def test_lora_update_correlation_on_constructed_updates() -> None:
    a = torch.nn.Parameter(torch.eye(2, 3))  # A: r x in = 2 x 3
    b = torch.nn.Parameter(torch.zeros(4, 2))  # B: out x r, zero as LoRA starts
    u = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [0.0, -1.0]])
    tracker = LoraUpdateTracker({"m": (a, b)})
    with torch.no_grad():
        b.copy_(u)  # dW_1 = U A
    assert tracker.step() == {}  # no previous update yet
    with torch.no_grad():
        b.copy_(3 * u)  # dW_2 = 2 U A: same direction
    assert tracker.step()["m"] == pytest.approx(1.0)
    with torch.no_grad():
        b.copy_(u)  # dW_3 = -2 U A: reversed
    assert tracker.step()["m"] == pytest.approx(-1.0)
    with torch.no_grad():
        a.add_(torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))  # dW_4 = U[:, 0] outer e_3
    # Pearson of vec(U e1 e3^T) and vec(-2 U A) over the 12 entries, computed by hand in maths.pearson.
    from exporters.training.maths import pearson

    expected = pearson(torch.outer(u[:, 0], torch.tensor([0.0, 0.0, 1.0])).flatten().tolist(),
                       (-2 * u @ torch.eye(2, 3)).flatten().tolist())  # fmt: skip
    assert tracker.step()["m"] == pytest.approx(expected)
