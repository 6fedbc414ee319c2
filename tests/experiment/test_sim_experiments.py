"""Each packaged experiment, run end to end on the sim (`loadlens experiment NAME`, which starts the sim and
runs `loadlens load` per trial) at a small scale: --speed 10 unless a test says otherwise, stages cut by
--time-scale, smaller sweeps through --param. Each analysis is checked against what the sim is known to do:

- batching-window: in the experiment's `admission` window mode every step that admits pays a 12 ms
  insertion overhead, so a small window slows every running request and a large one makes new ones wait:
  the median E2E is U-shaped, the fit's R² is above the stated bound (0.8) and its minimum is interior,
  deeper than the noise rule asks (docs/experiments.md).
- fairness: priority scheduling gives the interactive class a lower P95 than FCFS (at speed 1: by seconds).
- token-budget: a 64-token step budget holds fewer sequences running than 4096 tokens do (the budget binds).
- burst-capacity: with a 512-block KV cache and a 32-request waiting queue, 64 users at once get 429s while
  32 do not: the threshold lies between them, and the larger sizes are skipped.
- seed-benchmark: the chapter-1 table has a row per configuration with mean TTFT and output throughput.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.contracts.experiment_result import ExperimentResult, parse_experiment_result
from loadlens.contracts.slo import DEFAULT_SLO_FILE
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def run_experiment(
    tmp_path: Path, name: str, *args: str, timeout: float = 110, speed: str | None = "10"
) -> tuple[ExperimentResult, str]:
    """``speed=None``: the experiment's own ``sim.speed``."""
    argv = [sys.executable, "-m", "loadlens.cli", "experiment", name, "--results", str(tmp_path)]
    argv += [*(["--speed", speed] if speed else []), "--run-id", "ci", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    directory = tmp_path / "experiments" / "ci"
    doc: Any = json.loads((directory / "experiment_result.json").read_text())
    assert (directory / "report.html").is_file()
    return parse_experiment_result(doc), proc.stdout


def finding(result: ExperimentResult, name: str) -> bool | None:
    return next(f.passed for f in result.findings if f.name == name)


def ttft_only_slo_file(tmp_path: Path) -> Path:
    """The packaged SLO file with ITL and E2E bounds no loaded machine reaches (30 s and 300 s), so a level's
    verdict and goodput are decided by TTFT alone, which the sim's queueing decides (on CI a parallel worker
    pushed ITL p99 past 50 ms: see tests/loadgen/test_verdict_cli.py)."""
    slo = yaml.safe_load(DEFAULT_SLO_FILE.read_text())
    for cls in slo["classes"]:
        cls["itl_seconds"], cls["e2e_seconds"] = 30.0, 300.0
    path = tmp_path / "ttft-only.yaml"
    path.write_text(yaml.safe_dump(slo))
    return path


@pytest.mark.timeout(200)
def test_batching_window_on_the_sim(tmp_path: Path) -> None:
    """The packaged sim configuration (admission window, 12 ms insertion overhead) at the modeled load it
    names, 40 req/s, applied as the experiment says for a quicker run: speed 1 and rate 40 (its half-speed
    default, rate 20, takes twice the wall time per request). Six windows (the fit's five parameters need six
    points), a 1.5 s stage each (~55 requests), the median E2E fitted. Modeled medians (a discrete-event run
    of the same scheduler): ~590 ms at 3 ms, ~490 ms at 100 ms, ~1 s at 1 s, against the tens of ms a loaded
    machine adds (a run on the loaded 2-core machine: 566, 561, 483, 521, 618, 1097 ms; R² 0.99, dip 15 %)."""
    windows = "3000,10000,30000,100000,300000,1000000"
    result, out = run_experiment(tmp_path, "batching-window", "--time-scale", "0.025", "--param",
                                 f"windows={windows}", "--param", "metric=median_e2el_ms", "--param", "rate=40",
                                 speed="1", timeout=180)  # fmt: skip
    assert result.completed and [t.status for t in result.trials] == ["done"] * 6
    assert "trial 6/6 w1000000 repeat 1/1 (run 6/6; batching_window_us=1000000)" in out
    assert "--knob batching_window_mode=admission" in " ".join(result.server.sim_argv)
    rows = result.tables[0].rows
    assert [r["window"] for r in rows] == [3000.0, 10000.0, 30000.0, 100000.0, 300000.0, 1000000.0]
    fit = result.fits[0]
    assert fit.error is None and fit.r2 is not None and fit.r2 >= 0.8
    assert finding(result, "fit_r2") is True
    # The U: an interior minimum whose dip exceeds min_dip (5 %) and twice the fit's RMS residual.
    assert finding(result, "optimum_inside_range") is True, [f.detail for f in result.findings]
    assert fit.interior is True and fit.optimum_x is not None and 10000 < fit.optimum_x < 300000
    median = {r["window"]: float(r["median_e2el_ms"]) for r in rows}  # type: ignore[arg-type]
    best = min(median[30000.0], median[100000.0])
    assert best < median[3000.0] and best < median[1000000.0]
    assert len(fit.curve) == 60


@pytest.mark.timeout(180)  # 31 s in the parallel phase, x5 (tests/support/timeout_margins.py)
def test_fairness_on_the_sim(tmp_path: Path) -> None:
    """At the experiment's own speed 1, not 10: the interactive P95 gap between the policies is then modeled
    queueing of over a second (two loaded runs: 1022 vs 2391 ms, 1060 vs 2407 ms), which no stall of a loaded
    machine closes; at speed 10 it was 103 vs 264 ms, within reach of one."""
    result, _ = run_experiment(tmp_path, "fairness", "--time-scale", "0.1", speed=None)
    rows = {r["policy"]: r for r in result.tables[0].rows}
    assert list(rows) == ["fcfs", "priority"]
    assert finding(result, "priority_beats_fcfs") is True
    assert float(rows["priority"]["interactive.p95_e2el_ms"]) < float(rows["fcfs"]["interactive.p95_e2el_ms"])  # type: ignore[arg-type]
    for row in rows.values():
        assert 0 < float(row["jain_fairness_index"]) <= 1  # type: ignore[arg-type]
        assert float(row["batch.request_throughput"]) > 0  # type: ignore[arg-type]
        assert float(row["slack.min"]) > 0  # type: ignore[arg-type]
    # the FCFS trial sent priority 0 for both entries, yet each request kept its entry's class
    fcfs = next(t for t in result.trials if t.name == "fcfs")
    assert fcfs.figures["batch.completed"].mean and fcfs.figures["interactive.completed"].mean


@pytest.mark.timeout(150)
def test_token_budget_on_the_sim(tmp_path: Path) -> None:
    result, _ = run_experiment(tmp_path, "token-budget", "--time-scale", "0.05", "--param", "budgets=64,4096")
    rows = {(r["max_num_seqs"], r["max_num_batched_tokens"]): r for r in result.tables[0].rows}
    assert list(rows) == [(16, 64), (16, 4096), (64, 64), (64, 4096)]
    assert finding(result, "token_budget_binds") is True
    # Where it binds is the small budget, never the reference: which max_num_seqs shows it depends on how far
    # behind the loaded machine lets the sim fall (on CI, 64 x 64 once ran 43 against 39 at 64 x 4096).
    bound = [key for key, r in rows.items() if r["budget_binds"]]
    assert bound and all(tokens == 64 for _, tokens in bound)
    assert rows[(16, 4096)]["budget_binds"] is False and rows[(64, 4096)]["budget_binds"] is False


@pytest.mark.timeout(150)
def test_seed_benchmark_on_the_sim(tmp_path: Path) -> None:
    result, _ = run_experiment(tmp_path, "seed-benchmark", "--time-scale", "0.05")
    rows = result.tables[0].rows
    assert [r["trial"] for r in rows] == ["default", "half-kv"]
    for row in rows:
        assert float(row["mean_ttft_ms"]) > 0 and float(row["output_throughput"]) > 0  # type: ignore[arg-type]
        assert row["server.peak_vram_gib"] is None  # needs --prometheus


@pytest.mark.timeout(150)
def test_burst_capacity_on_the_sim(tmp_path: Path) -> None:
    """b64's 429s come from counts: 64 users against ~21 KV-bound running sequences plus a 32-request queue
    (8 % of its requests in a loaded run, against the 1 % criterion); b32 never gets one (32 users cannot
    overfill a 32-request queue). b32 does preempt (32 growing sequences overfill the 512
    blocks) and passes because its preemptions per request stay under the storm threshold, 0.5: 0.29-0.36 in
    nine loaded runs here. A loaded machine only lowers it: the most pressure 32 closed-loop users put on the
    cache is when each client turns around instantly compared to a step, which speed 1 and 3 approximate
    (0.380 over 347 requests at speed 1, 0.387 at speed 3); a stalled sim comes closer to that, a stalled
    client leaves fewer requests in flight."""
    result, out = run_experiment(tmp_path, "burst-capacity", "--time-scale", "0.1", "--repeats", "1")
    assert "every repeat of b64 failed" in out
    assert [(t.name, t.status) for t in result.trials] == [
        ("b8", "done"), ("b16", "done"), ("b32", "done"), ("b64", "done"), ("b128", "skipped"), ("b256", "skipped"),
    ]  # fmt: skip
    assert result.completed
    rows = {r["burst"]: r for r in result.tables[0].rows}
    assert [rows[b]["failure_probability"] for b in (8, 16, 32, 64)] == [0.0, 0.0, 0.0, 1.0]
    assert "rate_limited_ratio" in str(rows[64]["failed_by"])
    assert result.tables[1].rows == [{"estimate": 48.0, "low": 32.0, "high": 64.0}]
    assert finding(result, "threshold_found") is True


@pytest.mark.timeout(330)  # 61 s in the parallel phase, x5 (tests/support/timeout_margins.py)
def test_slo_search_on_the_sim(tmp_path: Path) -> None:
    """Bracketing from 8 users then bisection: the capacity and the level above it are adjacent, every level
    up to the capacity passed and the one above failed. TTFT alone decides a level (``ttft_only_slo_file``):
    at 8 users its p99 was 34-55 ms in three loaded runs against 200 ms, and the knee the search finds (44-54
    users) is the sim's queueing. Nine levels took 61-77 s on the loaded 2-core box: the timeouts are 3x that."""
    slo_file = ttft_only_slo_file(tmp_path)
    result, out = run_experiment(tmp_path, "slo-search", "--time-scale", "0.05", "--slo-file", str(slo_file),
                                 timeout=230)  # fmt: skip
    assert "level=8 (c8) repeat 1/1, 0 levels measured" in out
    assert finding(result, "capacity_found") is True
    capacity = result.tables[1].rows[0]
    assert capacity["next_failing"] == float(capacity["capacity"]) + 1  # type: ignore[arg-type]
    levels = result.tables[0].rows
    assert [r["level"] for r in levels] == sorted(r["level"] for r in levels)  # type: ignore[type-var]
    assert levels[0]["level"] == 8 and levels[0]["level_passes"] is True  # 8 users of the 8B model at speed 10
    assert all(r["level_passes"] is (float(r["level"]) <= float(capacity["capacity"])) for r in levels)  # type: ignore[arg-type]


@pytest.mark.timeout(90)  # 12 s in the parallel phase, x5 (tests/support/timeout_margins.py)
def test_calibration_sweep_records_the_engine_counters_on_the_sim(tmp_path: Path) -> None:
    """Two stages (one per ladder) on the sim: each run's server sample carries the increases of vLLM's
    engine counters over its measured window, consistent with the client's count of requests and tokens
    (what ``loadlens calibrate`` reads, docs/calibration.md)."""
    # Stages of 2 s: samples four times a second (the sweep's own once a second could leave one sample in one).
    result, _ = run_experiment(tmp_path, "calibration-sweep", "--time-scale", "0.1", "--param", "concurrency=2",
                               "--param", "prompt_lengths=32", "--param", "output=16", "--param", "output_stdev=4",
                               "--sample-interval", "0.25",
                               speed="1")  # fmt: skip
    assert result.experiment.sample_interval == 0.25
    drawn = {"output_stdev": 4, "think_s": 0.1, "think_stdev_s": 0.1}  # recorded: what calibrate replays
    assert [(t.name, t.params, t.status) for t in result.trials] == [
        ("c2-p128", {"users": 2, "prompt_tokens": 128, **drawn}, "done"),
        ("p32-c2", {"prompt_tokens": 32, "users": 2, **drawn}, "done"),
    ]
    # Each run its own prompts: with one seed the second trial's 32-token prompts would begin as the first's
    # 128-token ones did, and the sim's prefix cache (on, as vLLM's) would serve their first blocks.
    assert result.trials[1].runs[0].seed == (result.trials[0].runs[0].seed or 0) + 1000
    for trial in result.trials:
        run = trial.runs[0]
        counters = run.server.engine_counters
        assert counters["vllm:prefix_cache_queries_total"] > 0
        assert counters["vllm:prefix_cache_hits_total"] == 0
        steps = counters["vllm:iteration_tokens_total_count"]
        # Every step is counted once; a request's 16 tokens take 16 steps, so steps >= its tokens / users.
        assert steps >= counters["vllm:generation_tokens_total"] / 2 > 0
        assert counters['vllm:iteration_tokens_total_bucket{le="+Inf"}'] == steps
        # The counters cover the sampled part of the measured window (its first to last /metrics reading):
        # they saw at most the requests the client completed in the whole window, and cover most of it.
        assert 0 < counters["vllm:request_success_total"] <= (run.figures["completed"] or 0) + 2
        assert 0.5 * (run.figures["duration"] or 0) <= counters["seconds"] <= (run.figures["duration"] or 0)
        assert counters["vllm:request_prefill_time_seconds_count"] == counters["vllm:request_success_total"]
