"""A training experiment watched by the local stack, for real: `loadlens experiment training-stability` with
`--training-metrics-port` at the stack's training target, a learning-rate spike in every run, and the stack's
Prometheus, Alertmanager and pager. Each run waits for a scrape before and after it (its counters at 0, then
after the jump), so Prometheus holds every run's step counter, and the runs whose own telemetry counted a
gradient-norm jump (`alert.grad_norm_jump` in the experiment's result) are exactly the runs paged for
`LoadlensTrainingGradNormJump`.

Timing budget (stated bound): scrape and rule evaluation every 1 s, the rule has no `for`, group_wait 1 s;
every page must be in the pager's log within 40 s of the experiment's end (measured 0.0, 0.0 and 5.0 s in three
runs on the 2-core box beside a whole `make test`, the call 15-20 s; the test is in tests/conftest.py SERIAL).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from loadlens.contracts.experiment_result import parse_experiment_result
from loadlens.experiment.training.spec import training_path
from loadlens.stack.runner import Stack
from loadlens.train_demo import ALERT, pages_of
from tests.support.stack import running_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PAGE_BOUND_S = 40
TINY: dict[str, Any] = {"micro_batch": 2, "seq_len": 8, "val_sequences": 4, "eval_every": 3, "model": "small",
                        "device": "cpu", "target_loss": 4.5, "steps": 10, "save_every": 5,
                        "spike_step": 3, "spike_factor": 5000.0, "spike_steps": 2}  # fmt: skip


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path / "stack") as s:
        yield s


def _experiment(tmp_path: Path) -> Path:
    packaged = training_path("training-stability")
    assert packaged is not None
    doc = yaml.safe_load(packaged.read_text())
    doc["parameters"].update(TINY)
    doc["repeats"] = 1
    path = tmp_path / "training-stability.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _paged_runs(stack: Stack) -> set[str]:
    return {
        a["labels"]["run"]
        for note in pages_of(stack.o.run_dir, ALERT)
        for a in note["alerts"]
        if a["labels"].get("alertname") == ALERT and a["status"] == "firing"
    }


def test_the_stack_pages_exactly_the_runs_whose_gradient_norm_jumped(stack: Stack, tmp_path: Path) -> None:
    prom = next(s.url for s in stack._load() if s.name == "prometheus")
    port = str(stack.o.training_port)
    cmd = [sys.executable, "-m", "loadlens.cli", "experiment", str(_experiment(tmp_path)), "--results",
           str(tmp_path / "results"), "--run-id", "watched", "--training-metrics-port", port]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no scrape of the training series" not in proc.stdout
    ended = time.monotonic()
    doc = json.loads((tmp_path / "results/experiments/watched/experiment_result.json").read_text())
    result = parse_experiment_result(doc)
    runs = {f"watched/{t.name}/r1": t.runs[0].figures for t in result.trials}
    assert len(runs) == 4
    jumped = {name for name, figures in runs.items() if figures["alert.grad_norm_jump"] == 1.0}
    assert "watched/baseline/r1" in jumped  # full fine-tuning at 5000x the learning rate: the spike shows

    paged = _paged_runs(stack)
    while paged != jumped and time.monotonic() - ended < PAGE_BOUND_S:
        time.sleep(0.5)
        paged = _paged_runs(stack)
    assert paged == jumped

    # Prometheus saw every run, from its 0 to its last step.
    query = httpx.get(prom + "/api/v1/query", params={"query": "max_over_time(loadlens_training_step_total[5m])"})
    steps = {r["metric"]["run"]: float(r["value"][1]) for r in query.json()["data"]["result"]}
    assert {name: steps.get(name) for name in runs} == {name: runs[name]["steps_run"] for name in runs}
