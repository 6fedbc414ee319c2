"""``loadlens experiment hot-swap`` end to end on the sim, twice at once: the packaged definition with its GPU
profile's adapter costs made slow in one run and fast in the other (docs/sim-engine.md §4: a load reads
bytes / ``adapter_read_bytes_per_s``; a GPU-slot fill costs ``adapter_load_fixed_seconds`` + bytes /
``host_to_device_bytes_per_s``), at a small scale (40 requests per trial, the sim at speed 2).

What the sim makes certain, by wide margins: slow, the rank-64 swap adapter's read takes 1.09 s modeled (0.55 s
wall) and every slot fill at least 0.5 s modeled, so every request in the engine during one is blocked for
more than 200 ms unless it arrived in its last 200 ms, and each trial sees several swaps with requests in
flight: far more than 0.5 % of 40 requests are delayed, the SLA is broken. Fast, a read or a fill takes
microseconds: no request comes near 200 ms, the SLA holds, while requests are still blocked (the swaps
happened and were measured). The run's result is read back by ``loadlens report`` and ``loadlens compare``.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.contracts.experiment_result import ExperimentResult, parse_experiment_result
from loadlens.contracts.gpu_profile import GPU_DIR
from loadlens.experiment.models import resolve_experiment_path
from tests.support.paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

GPU_PROFILE = GPU_DIR / "a100-80gb-sxm.yaml"
COSTS = {
    "slow": {"adapter_read_bytes_per_s": 1e8, "adapter_load_fixed_seconds": 0.5, "host_to_device_bytes_per_s": 1e8},
    "fast": {"adapter_read_bytes_per_s": 1e13, "adapter_load_fixed_seconds": 1e-6, "host_to_device_bytes_per_s": 1e13},
}
ARGS = ["--speed", "2", "--param", "requests=40", "--param", "rate=8", "--param", "swap_every=0.75"]


def experiment_with(tmp_path: Path, costs: str) -> Path:
    """The packaged hot-swap definition on a GPU profile with these adapter costs."""
    gpu: dict[str, Any] = yaml.safe_load(GPU_PROFILE.read_text())
    gpu.update(COSTS[costs])
    gpu_path = tmp_path / f"gpu-{costs}.yaml"
    gpu_path.write_text(yaml.safe_dump(gpu))
    exp: dict[str, Any] = yaml.safe_load(resolve_experiment_path("hot-swap").read_text())
    exp["sim"]["gpu_profile"] = str(gpu_path)
    path = tmp_path / f"hot-swap-{costs}.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path


def run(tmp_path: Path, costs: str) -> tuple[ExperimentResult, Path]:
    argv = [sys.executable, "-m", "loadlens.cli", "experiment", str(experiment_with(tmp_path, costs)),
            "--results", str(tmp_path), "--run-id", costs, *ARGS]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    directory = tmp_path / "experiments" / costs
    return parse_experiment_result(yaml.safe_load((directory / "experiment_result.json").read_text())), directory


def rows(result: ExperimentResult) -> dict[tuple[Any, Any], dict[str, Any]]:
    table = next(t for t in result.tables if t.name == "hot_swap")
    return {(r["trial"], r["model"]): r for r in table.rows}


def findings(result: ExperimentResult) -> dict[str, bool | None]:
    return {f.name: f.passed for f in result.findings}


def test_a_slow_adapter_load_breaks_the_sla_and_a_fast_one_passes(tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool:
        (slow, slow_dir), (fast, _) = pool.map(lambda c: run(tmp_path, c), ["slow", "fast"])

    for result in (slow, fast):
        assert result.completed and [t.status for t in result.trials] == ["done", "done"]
        assert [t.params["mode"] for t in result.trials] == ["scheduled", "on-demand"]
        table = rows(result)
        for trial in ("scheduled", "on-demand"):
            # The requests that ended between the stage's first and last /metrics sample (0.25 s apart): a sample
            # of the stage's requests whose size is a timing (a burst after a swap can fall after the last
            # sample), so some were counted and no more than could have ended in the stage: its own and the
            # warm-up's two closed-loop users' last requests.
            (trial_run,) = next(t for t in result.trials if t.name == trial).runs
            ended = (trial_run.figures["completed"] or 0.0) + (trial_run.figures["failed"] or 0.0) + 2
            assert 0 < table[(trial, "all")]["requests"] <= ended
            assert table[(trial, "all")]["swaps"] >= 1
            assert {model: r["rank"] for (t, model), r in table.items() if t == trial} == {
                "all": None, "lora-a": 64, "lora-b": 32, "lora-c": 16,
            }  # fmt: skip
        scheduled = result.trials[0].runs[0].server.lora_swap
        assert scheduled is not None and scheduled.driver_loads is not None and scheduled.driver_loads >= 1
        assert scheduled.swaps_source == "sim_adapter_loads" and scheduled.delay_exact is True

    table = rows(slow)
    assert findings(slow) == {"sla_met.scheduled": False, "swaps_seen.scheduled": True,
                              "sla_met.on-demand": False, "swaps_seen.on-demand": True}  # fmt: skip
    for trial in ("scheduled", "on-demand"):
        assert table[(trial, "all")]["delayed_ratio"] > 0.05  # ten times the SLA's 0.5 %
        assert table[(trial, "all")]["sla_met"] is False
    table = rows(fast)
    assert findings(fast) == {"sla_met.scheduled": True, "swaps_seen.scheduled": True,
                              "sla_met.on-demand": True, "swaps_seen.on-demand": True}  # fmt: skip
    for trial in ("scheduled", "on-demand"):
        assert table[(trial, "all")]["delayed_requests"] == 0 and table[(trial, "all")]["sla_met"] is True
    assert table[("on-demand", "all")]["blocked_requests"] > 0

    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "loadlens.cli", "report", "--results", str(slow_dir), "--out", str(out),
         "--prometheus", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = (out / "index.html").read_text()
    assert "sla_met.scheduled" in page and "hot-swap interruption per trial and model" in page
    proc = subprocess.run(
        [sys.executable, "-m", "loadlens.cli", "compare", str(slow_dir / "experiment_result.json"),
         "--figures", "swap.delayed_ratio,swap.mean_blocked_ms,swap.models.lora-a.p99_blocked_ms"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "slow/scheduled (baseline)" in lines[0] and "slow/on-demand" in lines[0]
    assert [line.split()[0] for line in lines[1:4]] == [
        "swap.delayed_ratio", "swap.mean_blocked_ms", "swap.models.lora-a.p99_blocked_ms",
    ]  # fmt: skip
