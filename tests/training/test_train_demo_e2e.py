"""`make train-demo` end to end, for real: the local stack scrapes a LoRA fine-tuning run on CPU (transformers
Trainer with LoadlensCallback, torch, peft), and the learning-rate spike's gradient-norm jump pages through
Prometheus and Alertmanager to the pager.

Timing budget (stated bound): scrape and rule evaluation every 1 s; the rule has no `for`; the local stack's
group_wait is 1 s. The page must arrive within 40 s of the trainer saying its /metrics is up: model set-up, 15
steps at 0.2 s to the spike, then a scrape, an evaluation and the group wait. The clock starts there, not at
the trainer's start, because the cold torch/transformers import before it (4-9 s measured) is the machine's
pace, not the pipeline's. Measured: 5 serial runs on the 2-core dev box while four other sessions ran their
tests took 5.5-13.1 s; the bound is 3x the worst (the test is in tests/conftest.py SERIAL).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlens.stack.runner import PROBE_DIR, Stack
from loadlens.train_demo import ALERT, training_command, wait_for_page
from tests.support.stack import running_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
PAGE_BOUND_S = 40  # 3x the worst of 5 serial runs (13.1 s)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path) as s:
        yield s


def test_learning_rate_spike_pages_grad_norm_jump(stack: Stack) -> None:
    o = stack.o
    assert (o.run_dir / PROBE_DIR).is_dir()  # where a GPU trainer's probe would write (none on CPU)
    env = {**os.environ, "LOADLENS_PROBE_DIR": str(o.run_dir / PROBE_DIR)}
    cmd = training_command(o, steps=30, spike_step=15, step_seconds=0.2)
    trainer = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert trainer.stdout is not None
    said: list[str] = []
    try:
        # The clock starts when the trainer says /metrics is up: torch and transformers are imported by then,
        # and a cold import is the machine's pace, not the pipeline's.
        for line in trainer.stdout:
            said.append(line)
            if line.startswith("train-demo: /metrics"):
                break
        started = time.monotonic()
        page = wait_for_page(o.run_dir, ALERT, PAGE_BOUND_S)
        elapsed = time.monotonic() - started
    finally:
        trainer.terminate()
        trainer.wait(timeout=30)
    with trainer.stdout:
        out = "".join(said) + trainer.stdout.read()
    assert page is not None, f"no {ALERT} page within {PAGE_BOUND_S} s; trainer said:\n{out[-3000:]}"
    (alert,) = [a for a in page["alerts"] if a["labels"]["alertname"] == ALERT]
    assert (page["receiver"], alert["status"]) == ("ticket", "firing")
    assert (alert["labels"]["run"], alert["labels"]["severity"], alert["labels"]["component"]) == (
        "train-demo", "warning", "training",
    )  # fmt: skip
    assert elapsed < PAGE_BOUND_S
