"""The ``lora_rank`` analysis on hand-made results: the guide's table with sizes, per-token latency and its
increment over the base; the power-law fit of the increment (exact on exact points, b's uncertainty from the
points' standard errors and from the residuals); the ``sub_linear`` finding passes, fails and is not judged as
docs/experiments.md says."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from loadlens.cli import main
from loadlens.contracts.experiment_result import (
    AdapterRecord,
    ExperimentInfo,
    ExperimentResult,
    ServerInfo,
    Trial,
    TrialRun,
    parse_experiment_result,
)
from loadlens.contracts.slo import load_slos
from loadlens.experiment.analysis.analyse import analyse
from loadlens.experiment.analysis.lora_rank import MIB, PowerFitError, fit_power_law, standard_error
from loadlens.experiment.figures import aggregate
from loadlens.experiment.models import Analysis, load_experiment, resolve_experiment_path
from loadlens.util.net import free_port
from tests.support.paths import ROOT

SPEC = Analysis(kind="lora_rank", y="mean_tpot_ms")


def record(rank: int) -> AdapterRecord:
    return AdapterRecord(
        name=f"r{rank}", rank=rank, alpha=16, target_modules=["q_proj", "v_proj"], dtype="bf16", init_b="random",
        seed=0, base="tiny", path=f"/x/r{rank}", server_path=f"/x/r{rank}", formula_bytes=rank * 1024 * 1024,
        file_bytes=rank * 1024 * 1024 + 2048,
    )  # fmt: skip


def trial(index: int, name: str, tpots: list[float], adapters: list[str], std: float = 0.5, n: int = 2500) -> Trial:
    """One trial whose repeats measured these mean TPOTs, each over ``n`` samples of standard deviation ``std``;
    ITL is TPOT + 0.01 ms, p50/p99 around it."""
    runs = [
        TrialRun(repeat=k, run_id=f"r{k}", result_path="x", log_path="y", exit_code=0, completed=True,
                 start_timestamp=0.0, end_timestamp=1.0, duration_s=1.0,
                 figures={"mean_tpot_ms": v, "std_tpot_ms": std, "tpot_samples": float(n), "p50_tpot_ms": v,
                          "p99_tpot_ms": v * 1.1, "mean_itl_ms": v + 0.01, "p50_itl_ms": v, "p99_itl_ms": v * 1.2})
        for k, v in enumerate(tpots, start=1)
    ]  # fmt: skip
    return Trial(index=index, name=name, profile="p", adapters=adapters, status="done", runs=runs,
                 figures=aggregate(runs))  # fmt: skip


def result(incs: dict[int, float], base: float = 5.0, **kw: float) -> ExperimentResult:
    trials = [trial(0, "base", [base], [], **kw)]  # type: ignore[arg-type]
    trials += [trial(i, f"r{r}", [base + inc], [f"r{r}"], **kw) for i, (r, inc) in enumerate(incs.items(), 1)]  # type: ignore[arg-type]
    res = ExperimentResult(
        run_id="x",
        experiment=ExperimentInfo(name="lora-rank", source="x.yaml", sha256="0" * 64, repeats=1, time_scale=1.0,
                                  users_scale=1.0, analysis="lora_rank"),
        server=ServerInfo(mode="sim"),
        start_time="2026-12-05T00:00:00Z",
        adapters=[record(r) for r in incs],
        trials=trials,
    )  # fmt: skip
    return analyse(SPEC, load_slos())(res)


def finding(res: ExperimentResult) -> tuple[bool | None, str]:
    (f,) = res.findings
    assert f.name == "sub_linear"
    return f.passed, f.detail


def test_the_table_has_sizes_latency_and_the_increment_per_rank() -> None:
    res = result({2: 1.2, 8: 2.9, 32: 6.7})
    rows = res.tables[0].rows
    assert [r["rank"] for r in rows] == [0, 2, 8, 32]
    assert [r["adapter"] for r in rows] == [None, "r2", "r8", "r32"]
    assert [r["formula_mib"] for r in rows] == [None, 2.0, 8.0, 32.0]
    assert rows[2]["file_mib"] == 8 + 2048 / 1024 / 1024
    assert [r["mean_tpot_ms"] for r in rows] == [5.0, 6.2, 7.9, 11.7]
    assert [r["increment_mean_tpot_ms"] for r in rows] == pytest.approx([None, 1.2, 2.9, 6.7])
    assert rows[3]["increment_mean_tpot_ms_pct"] == pytest.approx(6.7 / 5.0)
    assert rows[1]["increment_mean_itl_ms"] == pytest.approx(1.2) and rows[1][
        "increment_mean_itl_ms_pct"
    ] == pytest.approx(1.2 / 5.01)
    assert rows[0]["increment_mean_tpot_ms"] is None and rows[0]["fit"] is None
    assert (rows[1]["p99_tpot_ms"], rows[1]["p99_itl_ms"]) == pytest.approx((6.2 * 1.1, 6.2 * 1.2))
    # one run of 2500 samples with std 0.5: standard error 0.01 ms per trial, the increment's √2 of it
    assert rows[1]["mean_tpot_ms_se"] == pytest.approx(0.01)
    assert rows[1]["increment_mean_tpot_ms_se"] == pytest.approx(0.01 * math.sqrt(2))
    assert [p.name for p in res.plots] == ["latency", "increment"] and res.plots[1].fit == "increment"


def test_the_guides_figures_fit_a_sub_linear_power_law() -> None:
    """1.2 / 2.9 / 6.7 ms at r = 2 / 8 / 32: slopes ln(2.9/1.2)/ln 4 = 0.637 and ln(6.7/2.9)/ln 4 = 0.604."""
    res = result({2: 1.2, 8: 2.9, 32: 6.7})
    (fit,) = res.fits
    assert fit.error is None and fit.formula == "a*x^b" and fit.points == 3
    expected_b = math.log(6.7 / 1.2) / math.log(16)  # the least-squares slope of three log-spaced points
    assert fit.params["b"] == pytest.approx(expected_b)
    assert fit.r2 is not None and fit.r2 > 0.999
    assert fit.params_err["b"] > 0 and fit.params["b"] + fit.params_err["b"] < 1
    passed, detail = finding(res)
    assert passed is True and "b below 1 by more than its uncertainty" in detail
    assert res.tables[2].name == "fit" and res.tables[2].rows[0]["b"] == pytest.approx(expected_b)
    assert len(fit.curve) == 60 and fit.curve[0][0] == 2.0 and fit.curve[-1][0] == pytest.approx(32.0)


def test_a_linear_increment_fails() -> None:
    passed, detail = finding(result({2: 0.5, 8: 2.0, 32: 8.0}))
    assert passed is False and "b >= 1" in detail


def test_b_within_its_uncertainty_of_1_is_not_judged() -> None:
    """b = 0.95 exactly (no residual), but the increments' standard errors (std 20 ms over 2500 samples: 0.4 ms
    per trial) make b's uncertainty larger than 0.05."""
    incs = {r: 2.0 * (r / 2) ** 0.95 for r in (2, 8, 32)}
    passed, detail = finding(result(incs, std=20.0))
    assert passed is None and "within its uncertainty of 1" in detail


@pytest.mark.parametrize(
    ("incs", "why"),
    [
        ({2: -0.1, 8: 2.0, 32: 5.0}, "increment <= 0 or within 2 standard errors of it at r=2 (-0.1 ms ± 0.014)"),
        ({2: 0.02, 8: 2.0, 32: 5.0}, "increment <= 0 or within 2 standard errors of it at r=2 (+0.02 ms ± 0.014)"),
        ({8: 2.0, 32: 5.0}, "needs at least 3 ranks with an increment, got 2"),
    ],
)
def test_unusable_points_are_not_judged(incs: dict[int, float], why: str) -> None:
    res = result(incs)
    passed, detail = finding(res)
    assert passed is None and detail == f"not judged: {why}"
    assert res.fits[0].error == why and res.fits[0].params == {} and [t.name for t in res.tables] == ["ranks", "detail"]


def test_no_base_trial_is_not_judged() -> None:
    res = result({2: 1.0, 8: 2.0, 32: 4.0})
    res.trials[0].status = "failed"
    analyse(SPEC, load_slos())(res)
    assert finding(res) == (None, "not judged: no done trial without adapters (the base)")


def test_power_fit_standard_errors() -> None:
    """Exact points: zero residual error; the measured error is Σ(u−ū)²(σ/y)²/Sxx² in log space."""
    xs, ys = [2.0, 8.0, 32.0], [1.0, 2.0, 4.0]  # b = 0.5
    fit = fit_power_law(xs, ys, [0.1, 0.1, 0.1])
    assert (fit.a, fit.b, fit.r2) == pytest.approx((1 / math.sqrt(2), 0.5, 1.0))
    assert fit.b_se_residual == pytest.approx(0.0, abs=1e-12)
    u = [math.log(x) for x in xs]
    sxx = sum((v - u[1]) ** 2 for v in u)
    assert fit.b_se_measured == pytest.approx(math.sqrt(((u[0] - u[1]) ** 2 * 0.01 + (u[2] - u[1]) ** 2 * 0.0025 / 4)
                                                        / sxx**2))  # fmt: skip
    assert fit.b_err == pytest.approx(2 * fit.b_se_measured)
    scattered = fit_power_law(xs, [1.0, 2.5, 4.0])
    assert scattered.b_se_residual is not None and scattered.b_se_residual > 0 and scattered.b_se_measured == 0.0
    for bad in (([2.0, 2.0], [1.0, 2.0]), ([2.0, 8.0], [0.0, 1.0]), ([2.0], [1.0, 2.0])):
        with pytest.raises(PowerFitError):
            fit_power_law(*bad)


def test_standard_error_takes_the_larger_of_within_and_between_repeats() -> None:
    quiet = trial(0, "t", [5.0, 5.0], [], std=0.5, n=2500)  # within: √2·0.01/2, between: 0
    assert standard_error(quiet, "mean_tpot_ms") == pytest.approx(math.sqrt(2) * 0.01 / 2)
    spread = trial(0, "t", [5.0, 6.0], [], std=0.5, n=2500)  # between: 0.7071/√2 = 0.5
    assert standard_error(spread, "mean_tpot_ms") == pytest.approx(0.5)
    assert standard_error(spread, "p99_tpot_ms") == pytest.approx(0.55)  # only between repeats: 0.7778/√2


def test_a_median_is_fitted_with_its_own_standard_error() -> None:
    """y = median_tpot_ms: its within-run standard error is √(π/2) x the robust spread (p90 − p50) / 1.2816
    over √n, not the standard deviation a few stalled samples inflate; mean TPOT and ITL stay in the table with
    their increments. Without p90 the spread is the standard deviation."""
    res = result({2: 1.2, 8: 2.9, 32: 6.7}, std=0.5, n=2500)
    for t in res.trials:
        for r in t.runs:
            median = (r.figures["mean_tpot_ms"] or 0.0) - 0.1
            r.figures.update({"median_tpot_ms": median, "p50_tpot_ms": median, "p90_tpot_ms": median + 1.2816 * 0.2})
        t.figures = aggregate(t.runs)
    analyse(Analysis(kind="lora_rank", y="median_tpot_ms"), load_slos())(res)
    assert [c.key for c in res.tables[0].columns][3:6] == ["median_tpot_ms", "mean_tpot_ms", "mean_itl_ms"]
    rows = res.tables[0].rows
    assert rows[1]["median_tpot_ms"] == pytest.approx(6.1) and rows[1]["increment_median_tpot_ms"] == pytest.approx(1.2)
    assert rows[1]["increment_mean_tpot_ms"] == pytest.approx(1.2)
    assert rows[1]["median_tpot_ms_se"] == pytest.approx(math.sqrt(math.pi / 2) * 0.2 / 50)
    del res.trials[1].runs[0].figures["p90_tpot_ms"]
    assert standard_error(res.trials[1], "median_tpot_ms") == pytest.approx(math.sqrt(math.pi / 2) * 0.5 / 50)
    assert res.fits[0].y == "increment_median_tpot_ms" and finding(res)[0] is True
    assert res.plots[0].y == ["median_tpot_ms", "mean_tpot_ms", "mean_itl_ms"]


def test_the_packaged_experiment_expands_to_a_base_and_one_trial_per_rank() -> None:
    from loadlens.experiment.models import expand_adapters, expand_trials

    exp = load_experiment("lora-rank")
    assert exp.spec.analysis.kind == "lora_rank" and exp.spec.analysis.y == "{latency}"
    assert [(a.name, a.rank, a.alpha, a.target_modules) for a in expand_adapters(exp)] == [
        ("r2", 2, 16.0, ("q_proj", "v_proj")), ("r8", 8, 16.0, ("q_proj", "v_proj")),
        ("r32", 32, 16.0, ("q_proj", "v_proj")),
    ]  # fmt: skip
    assert [(t.name, t.profile, t.adapters) for t in expand_trials(exp)] == [
        ("base", "base", ()), ("r2", "adapter", ("r2",)), ("r8", "adapter", ("r8",)), ("r32", "adapter", ("r32",)),
    ]  # fmt: skip
    assert [t.name for t in expand_trials(exp.with_parameters({"ranks": "4,16"}))] == ["base", "r4", "r16"]


FIXTURE_GPU = Path(__file__).with_name("fixtures") / "h200-lora-matmuls.yaml"


def modeled_increments(gpu_profile: str, tokens: int, ranks: list[int]) -> list[float]:
    """The sim's LoRA term of one decode step of ``tokens`` sequences (modeled ms): kernel launches (layers x
    modules x the profile's launch cost) plus max(compute, memory) of the adapter's matmuls."""
    from exporters.serving.engines.sim import load_gpu_profile, load_model_profile
    from exporters.serving.engines.sim import roofline as rl

    model, gpu = load_model_profile("deepseek-r1-distill-llama-8b"), load_gpu_profile(gpu_profile)
    out = []
    for r in ranks:
        work = rl.LoraWork(params=rl.adapter_params(model, r, ["q_proj", "v_proj"]), modules_per_layer=2, rank=r,
                           tokens=tokens)  # fmt: skip
        out.append(rl.lora_seconds(model, gpu, [work]) * 1000.0)
    return out


def test_the_packaged_sim_profile_prices_lora_by_its_launches() -> None:
    """What the packaged experiment's sim (Llama-8B on h200) models at its 4 users: 32 layers x 2 modules x
    3 µs = 0.192 ms of launches a step whatever the rank, plus the matmuls' 0.0005 ms (r = 2) to 0.0087 ms
    (r = 32), memory-bound at 4 tokens: b ≈ 0.015 (docs/experiments.md, lora-rank)."""
    incs = modeled_increments("h200", 4, [2, 8, 32])
    assert incs == pytest.approx([0.1925, 0.1942, 0.2007], abs=5e-5)
    assert fit_power_law([2.0, 8.0, 32.0], incs).b == pytest.approx(0.015, abs=0.002)
    matmuls = modeled_increments(str(FIXTURE_GPU), 4, [2, 8, 32])
    assert matmuls == pytest.approx([0.527, 1.212, 2.784], abs=5e-4)
    assert fit_power_law([2.0, 8.0, 32.0], matmuls).b == pytest.approx(0.6)


@pytest.mark.slow
@pytest.mark.timeout(210)  # 38 s in the parallel phase, x5 (tests/support/timeout_margins.py)
def test_lora_rank_on_the_sim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The packaged experiment, its sim on ``FIXTURE_GPU``: the h200 profile whose LoRA term is its matmuls
    alone, growing as r^0.6 (0.53 / 1.21 / 2.78 ms modeled a 4-sequence decode step, on a 5.6 ms step). At
    speed 0.5 (11 ms steps: the sim and the client need half the CPU per token they do at speed 1), 64
    output tokens, ~5 s stages (--time-scale 0.08), fitting the median TPOT: a stalled host delays the
    tokens of the requests in flight, which moves a mean, and a starved client reads a stream in bursts,
    which moves token gaps (one run at load average 10: median token ITL 0.004 ms), but a request's TPOT
    spans its whole stream and the median over requests leaves out the stalled minority. Asserted, by wide
    margins: each increment between 0.7 and 2.2 x the modeled decode-step term over the speed (other users'
    prefill steps, whose LoRA term grows with their tokens, add to TPOT: 1.0-1.4 x measured), so cost grows
    with rank (2.3x per 4x rank); b within 0.2 of 0.6 (the prefill steps' term grows as r^0.6 too) and
    sub_linear passes. Then ``loadlens report`` and ``loadlens compare`` read the result."""
    doc = yaml.safe_load(resolve_experiment_path("lora-rank").read_text())
    doc["sim"]["gpu_profile"] = str(FIXTURE_GPU)
    source = tmp_path / "lora-rank.yaml"
    source.write_text(yaml.safe_dump(doc))
    argv = [sys.executable, "-m", "loadlens.cli", "experiment", str(source), "--results", str(tmp_path), "--run-id",
            "ci", "--speed", "0.5", "--time-scale", "0.08", "--param", "latency=median_tpot_ms",
            "--param", "output_tokens=64"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=140, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    directory = tmp_path / "experiments" / "ci"
    res = parse_experiment_result(json.loads((directory / "experiment_result.json").read_text()))
    assert res.completed and [(t.name, t.status) for t in res.trials] == [
        ("base", "done"), ("r2", "done"), ("r8", "done"), ("r32", "done"),
    ]  # fmt: skip
    rows = res.tables[0].rows
    assert [r["rank"] for r in rows] == [0, 2, 8, 32]
    # 32 layers x r x ((4096 + 4096) + (4096 + 1024)) x 2 bytes; the file adds its header
    assert [r["formula_mib"] for r in rows[1:]] == [32 * r * 13312 * 2 / MIB for r in (2, 8, 32)]
    assert all(float(r["file_mib"]) > float(r["formula_mib"]) for r in rows[1:])  # type: ignore[arg-type]
    modeled = [m / 0.5 for m in modeled_increments(str(FIXTURE_GPU), 4, [2, 8, 32])]
    for row, model in zip(rows[1:], modeled, strict=True):
        assert 0.7 * model < float(row["increment_median_tpot_ms"]) < 2.2 * model, (row, model)  # type: ignore[arg-type]
        assert row["mean_tpot_ms"] is not None and row["increment_mean_tpot_ms"] is not None
    fit = res.fits[0]
    assert fit.error is None and abs(fit.params["b"] - 0.6) < 0.2, fit
    assert finding(res)[0] is True
    assert main(["compare", str(directory / "experiment_result.json"), "--figures", "median_tpot_ms"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["figure", "ci/base", "(baseline)"] and "ci/r32" in lines[0]
    assert lines[1].split()[1] == f"{rows[0]['median_tpot_ms']:.4g}" and lines[1].split()[3].startswith("+")
    assert main(["report", "--results", str(directory), "--out", str(tmp_path / "page"),
                 "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 0  # fmt: skip
    page = (tmp_path / "page" / "index.html").read_text()
    assert "sub_linear" in page and "increment over the base" in page and "a*x^b" in page
