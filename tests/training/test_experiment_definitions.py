"""The training experiments' definitions (crash, convergence step, alerts, boundary, Wilson interval, the
dynamic checkpoint rule) and their analyses, on constructed inputs with known answers (no torch)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from exporters.training.maths import CheckpointPolicy
from loadlens.alerting import system_rules
from loadlens.contracts.experiment_result import (
    ExperimentInfo,
    ExperimentResult,
    ServerInfo,
    Stat,
    Trial,
    TrialRun,
)
from loadlens.experiment.analysis.analyse import wilson
from loadlens.experiment.errors import ExperimentError
from loadlens.experiment.training.analysis import accumulation_analysis, stability_analysis
from loadlens.experiment.training.definitions import (
    CORRELATION_ALERT_FOR_S,
    Crash,
    alerts,
    boundary,
    convergence_step,
    crash_after_step,
    deviation,
    smoothed,
    spread,
)
from loadlens.experiment.training.spec import TrainingAnalysis, load_training, training_path


def test_crash_non_finite_and_divergence() -> None:
    assert crash_after_step([4.0, 3.0, float("nan")], 1.5, 4) == Crash(3, "non_finite", "training loss nan at step 3")
    assert crash_after_step([4.0, 3.0, float("inf")], 1.5, 4) is not None
    # mean of the last 4 = (5 + 6 + 7 + 7) / 4 = 6.25 > 1.5 x 4.0 = 6.0: divergence at step 5
    crash = crash_after_step([4.0, 5.0, 6.0, 7.0, 7.0], 1.5, 4)
    assert crash is not None and (crash.step, crash.kind) == (5, "divergence")
    # 6.0 exactly is not beyond the bound; fewer steps than the window never diverge
    assert crash_after_step([4.0, 6.0, 6.0, 6.0, 6.0], 1.5, 4) is None
    assert crash_after_step([4.0, 100.0, 100.0], 1.5, 4) is None
    assert crash_after_step([], 1.5, 4) is None


def test_convergence_step_on_a_constructed_curve() -> None:
    evals = [(5, 3.0), (10, 1.2), (15, 0.9), (20, 0.8), (25, 0.7)]
    assert smoothed([3.0, 1.2, 0.9], 3) == pytest.approx([3.0, 2.1, 1.7])
    # smoothed (k=3): 3.0, 2.1, 1.7, 0.9667, 0.8 -> first <= 1.0 at step 20
    assert convergence_step(evals, 1.0, 3) == 20
    assert convergence_step(evals, 1.0, 1) == 15  # unsmoothed: 0.9 at step 15
    assert convergence_step(evals, 0.5, 3) is None
    assert deviation(120.0, 100.0) == pytest.approx(0.2)
    assert deviation(None, 100.0) is None and deviation(5.0, 0.0) is None


def test_wilson_interval_exact_values() -> None:
    assert wilson(0, 5) == (0.0, pytest.approx(0.43449149475208104, rel=1e-12))
    low, high = wilson(1, 10)
    assert (low, high) == (pytest.approx(0.01787574951572113, rel=1e-12), pytest.approx(0.4041563854975721, rel=1e-12))
    assert wilson(3, 3)[1] == 1.0


def test_dynamic_rule_decisions_on_a_constructed_sequence() -> None:
    policy = CheckpointPolicy(variance_threshold=0.025, window_steps=8, every=4)
    norms = [1.0] * 8 + [1.0, 1.4, 1.0, 1.4] + [1.0] * 4
    decisions = {s: policy.observe(s, g) for s, g in enumerate(norms, 1)}
    made = {s: (d.save, d.variance) for s, d in decisions.items() if d is not None}
    assert sorted(made) == [4, 8, 12, 16]
    assert made[4] == (False, None)  # 4 norms: the window is not full
    assert made[8] == (False, 0.0)
    # step 12: the window holds 1.0 x 6, 1.4 x 2 -> mean 1.1, variance (6 x 0.01 + 2 x 0.09) / 8 = 0.03 > 0.025
    assert made[12][0] is True and made[12][1] == pytest.approx(0.03)
    # step 16: 1.0, 1.4, 1.0, 1.4, 1.0 x 4 -> the same 0.03
    assert made[16][0] is True


def test_alerts_on_constructed_series() -> None:
    steps = [1, 2, 3, 4, 5]
    out = alerts(
        steps, [False, False, True, False, True], [100.0, 100.0, 100.0, 120.0, 120.0],
        [{}, {"q": 0.99}, {"q": 0.5}, {"q": 0.4, "v": 0.99}, {"q": 0.95}], [30.0] * 5,
        window=8, fluctuation_bound=0.15, correlation_min=0.92,
    )  # fmt: skip
    assert out.grad_norm_jump_steps == [3, 5]
    # (120 - 100) / mean(100, 100, 100, 120) = 20 / 105 = 0.19 >= 0.15 from step 4 on
    assert out.memory_fluctuation_steps == [4, 5]
    assert out.correlation_low_steps == [3, 4]
    assert out.correlation_alert is True  # q below 0.92 for steps 3 and 4: 60 s
    short = alerts(steps, [False] * 5, [1.0] * 5, [{}, {"q": 0.5}, {"q": 0.99}, {"q": 0.5}, {}], [30.0] * 5,
                   window=8, fluctuation_bound=0.15, correlation_min=0.92)  # fmt: skip
    assert short.correlation_alert is False and short.memory_fluctuation_steps == []


def test_correlation_alert_duration_matches_the_rule() -> None:
    source = Path(system_rules.__file__).read_text()
    block = source[source.index('"LoadlensTrainingLoraUpdateCorrelationLow"') :]
    assert block.split("\n")[2].strip().startswith('"1m"') and CORRELATION_ALERT_FOR_S == 60.0


def test_spread_and_boundary() -> None:
    assert spread([9.0, 9.0, 1.0, 3.0], 0.5) == pytest.approx(math.sqrt(2.0))
    assert spread([1.0, None], 0.0) is None
    assert boundary([(2, 0.0), (4, 0.01), (8, 0.06), (16, 0.2)], 0.05) == 8
    assert boundary([(2, 0.0), (4, 0.01)], 0.05) is None


def _trial(index: int, name: str, params: dict[str, object], runs: list[dict[str, float | None]]) -> Trial:
    trial_runs = [
        TrialRun(
            repeat=i + 1,
            run_id=f"r{i + 1}",
            result_path="x",
            log_path="x",
            exit_code=0,
            completed=True,
            start_timestamp=0,
            end_timestamp=1,
            duration_s=1,
            figures=f,
        )
        for i, f in enumerate(runs)
    ]
    keys = sorted({k for f in runs for k in f})
    figures = {}
    for k in keys:
        vals = [f.get(k) for f in runs]
        nums = [v for v in vals if v is not None]
        figures[k] = Stat(mean=sum(nums) / len(nums) if nums else None, n=len(nums), values=vals)
    return Trial(index=index, name=name, params=params, profile="training", status="done", runs=trial_runs,  # type: ignore[arg-type]
                 figures=figures)  # fmt: skip


def _result(trials: list[Trial], kind: str) -> ExperimentResult:
    info = ExperimentInfo(name="t", source="t.yaml", sha256="0", repeats=2, time_scale=1, users_scale=1, analysis=kind)
    return ExperimentResult(run_id="r", experiment=info, server=ServerInfo(mode="none"), start_time="t", trials=trials)


def test_accumulation_analysis_on_constructed_figures() -> None:
    rows = {2: (0.30, 0.9, 1.00), 4: (0.20, 0.6, 1.02), 8: (0.10, 0.3, 1.08), 16: (0.05, 0.2, 1.30)}
    trials = [
        _trial(
            i,
            f"acc{k}",
            {"accumulation": k},
            [{"lora_a_grad_norm_std": a, "lora_b_grad_norm_std": b, "final_val_loss": v, "optimizer_steps": 64 / k}],
        )
        for i, (k, (a, b, v)) in enumerate(rows.items())
    ]
    result = _result(trials, "accumulation_sensitivity")
    accumulation_analysis(TrainingAnalysis(kind="accumulation_sensitivity", threshold=0.05), result)
    table = result.tables[0].rows
    assert [r["val_loss_change"] for r in table] == pytest.approx([0.0, 0.02, 0.08, 0.30])
    assert [r["exceeds"] for r in table] == [False, False, True, True]
    assert result.tables[1].rows == [{"boundary": 8.0, "threshold": 0.05}]
    assert [(f.name, f.passed) for f in result.findings] == [
        ("boundary", None),
        ("lora_a_grad_norm_std_falls", True),
        ("lora_b_grad_norm_std_falls", True),
    ]
    assert [p.y for p in result.plots] == [["lora_a_grad_norm_std", "lora_b_grad_norm_std"], ["val_loss_change"]]


def test_stability_analysis_crash_rate_and_deviation() -> None:
    def runs(conv: list[float | None], crashed: list[int]) -> list[dict[str, float | None]]:
        return [{"convergence_step": c, "converged": 1.0 if c else 0.0, "crashed": float(k), "seed": float(i),
                 "train_loss_sum": 10.0 + i} for i, (c, k) in enumerate(zip(conv, crashed, strict=True))]  # fmt: skip

    base = {"lora": False, "gradient_checkpointing": False, "checkpoints": "fixed"}
    trials = [
        _trial(0, "baseline", base, runs([100.0, 100.0], [0, 0])),
        _trial(1, "gc-lora", {**base, "lora": True}, runs([120.0, None], [0, 1])),
        _trial(2, "gc-lora-dynamic", {**base, "lora": True, "checkpoints": "dynamic"}, runs([120.0, None], [0, 1])),
    ]
    result = _result(trials, "training_stability")
    stability_analysis(TrainingAnalysis(kind="training_stability", baseline="baseline"), result)
    rows = {r["configuration"]: r for r in result.tables[0].rows}
    assert rows["gc-lora"]["crash_rate"] == 0.5 and rows["gc-lora"]["convergence_deviation"] == pytest.approx(20.0)
    assert rows["gc-lora"]["crash_low"] == pytest.approx(wilson(1, 2)[0])
    assert rows["baseline"]["convergence_deviation"] == 0.0
    assert [(f.name, f.passed) for f in result.findings][0] == ("dynamic_rule_leaves_training_unchanged", True)


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("target_modules=q_proj,x_proj", "training-stability.yaml: parameters.target_modules: unknown module 'x_proj'"),
        ("rank=65", "training-stability.yaml: parameters.rank: 65 is above the width of q_proj (64, model small)"),
        ("accumulation=0", "training-stability.yaml: parameters.accumulation: must be >= 1, got 0"),
    ],
)
def test_bad_input_is_refused_naming_the_field(param: str, message: str) -> None:
    path = training_path("training-stability")
    assert path is not None
    key, value = param.split("=")
    with pytest.raises(ExperimentError) as err:
        load_training(path, {key: value})
    assert str(err.value).startswith(message)
