"""``loadlens experiment hot-swap`` once against the real vLLM rig (issue 23, item 4): the session's vLLM
(``--max-loras 1``, a CPU cache of 3, loadlens's plugin writing its probe directory) behind ``loadlens serve
--engine openai --upstream-probe-dir``, the packaged definition's on-demand trial with three adapters the
experiment writes for the tiny model (ranks 32, 8 and 2: the rig's ``--max-lora-rank`` is 32) in strict
rotation, so requests force vLLM to swap its one GPU slot.

The experiment reads the proxy's ``/metrics``; its verdict must come from real swap windows: the worker's slot
fills reached the proxy as windows (``loadlens_proxy_probe_swap_windows_total`` rose inside the measured
window, and is the swap count the table shows) and requests were charged blocking from them. How long they
were blocked is a timing of a loaded CPU (a CPU slot fill takes about a millisecond): printed, not asserted.
The trial's ``knobs`` are dropped (the proxy has no admin knobs: the slots are vLLM's ``--max-loras``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.contracts.experiment_result import parse_experiment_result
from loadlens.experiment.models import resolve_experiment_path
from loadlens.util.child import http_child_process
from loadlens.util.net import free_port
from tests.support import vllm_server as rig
from tests.support.paths import ROOT

# 84 s in the parallel phase, x5 (tests/support/timeout_margins.py)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PARAMS = {"requests": 24, "rate": 4, "output_tokens": 64, "rank_a": 32, "rank_b": 8, "rank_c": 2, "swap_rank": 8}


WARMUP_USERS = 2  # the packaged definition's warm-up: {users: 2, ...}


def on_demand_only(tmp_path: Path) -> Path:
    exp: dict[str, Any] = yaml.safe_load(resolve_experiment_path("hot-swap").read_text())
    (trial,) = [t for t in exp["trials"] if t["name"] == "on-demand"]
    del trial["knobs"]
    exp["trials"] = [trial]
    assert exp["warmup"]["users"] == WARMUP_USERS
    path = tmp_path / "hot-swap-vllm.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path


def test_hot_swap_experiment_on_the_real_vllm_behind_the_proxy(
    vllm_server: rig.VllmServer, vllm_probe_dir: Path, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    port = free_port()
    proxy = [sys.executable, "-m", "loadlens.cli", "serve", "--engine", "openai", "--upstream", vllm_server.url,
             "--upstream-probe-dir", str(vllm_probe_dir), "--lora-root", str(results), "--port", str(port),
             "--log-level", "warning"]  # fmt: skip
    with http_child_process(proxy, port, cwd=ROOT, timeout_s=60) as child:
        argv = [sys.executable, "-m", "loadlens.cli", "experiment", str(on_demand_only(tmp_path)),
                "--host", child.url, "--lora-base", str(vllm_server.model.path), "--results", str(results),
                "--run-id", "vllm", *[a for k, v in PARAMS.items() for a in ("--param", f"{k}={v}")]]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout)
    doc = json.loads((results / "experiments" / "vllm" / "experiment_result.json").read_text())
    result = parse_experiment_result(doc)
    (trial,) = result.trials
    assert trial.status == "done" and trial.adapters == ["lora-a", "lora-b", "lora-c"]
    swap = trial.runs[0].server.lora_swap
    assert swap is not None
    assert swap.probe_swap_windows is not None and swap.probe_swap_windows > 0
    assert swap.swaps_source == "probe_swap_windows" and swap.swaps == swap.probe_swap_windows
    assert swap.sim_adapter_loads is None  # no sim series behind the proxy: absent, not 0
    # The requests that ended between the measured stage's first and last /metrics sample (0.25 s apart): a
    # sample of the stage's requests (loadlens/experiment/swap_series.py). How many is a timing: with one GPU
    # slot vLLM finishes them in bursts per adapter, and on a loaded CPU a burst can fall after the last sample
    # (CI once counted 11 of 24). So: some were counted, and no more than could have ended in the window (the
    # stage's own, plus the warm-up's two closed-loop users' last requests).
    run = trial.runs[0]
    ended = (run.figures["completed"] or 0.0) + (run.figures["failed"] or 0.0) + WARMUP_USERS
    assert swap.requests is not None and 0 < swap.requests <= ended
    assert sum(f.requests or 0.0 for f in swap.models.values()) == swap.requests
    assert swap.blocked_requests is not None and swap.blocked_requests > 0
    assert swap.delay_exact is True
    assert {m for m, f in swap.models.items() if f.requests} == {"lora-a", "lora-b", "lora-c"}
    verdict = {f.name: f.passed for f in result.findings}
    assert verdict["swaps_seen.on-demand"] is True
    assert verdict["sla_met.on-demand"] is not None  # judged from the windows' blocking (its value is a timing)
