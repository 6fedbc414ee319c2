"""`make train-demo` end to end, for real: the local stack scrapes a LoRA fine-tuning run on CPU (transformers
Trainer with LoadlensCallback, torch, peft), and the learning-rate spike's gradient-norm jump pages through
Prometheus and Alertmanager to the pager.

Timing budget (stated bound): scrape and rule evaluation every 1 s; the rule has no `for`; the warning route's
group_wait is 10 s. The page must arrive within 60 s of the training process starting (about 10 s of it
import and model set-up, 30 steps at 0.2 s).
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
PAGE_BOUND_S = 60


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path) as s:
        yield s


def test_learning_rate_spike_pages_grad_norm_jump(stack: Stack) -> None:
    o = stack.o
    assert (o.run_dir / PROBE_DIR).is_dir()  # where a GPU trainer's probe would write (none on CPU)
    env = {**os.environ, "LOADLENS_PROBE_DIR": str(o.run_dir / PROBE_DIR)}
    cmd = training_command(o, steps=30, spike_step=15, step_seconds=0.2)
    started = time.monotonic()
    trainer = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        page = wait_for_page(o.run_dir, ALERT, PAGE_BOUND_S)
        elapsed = time.monotonic() - started
    finally:
        trainer.terminate()
        out, _ = trainer.communicate(timeout=30)
    assert page is not None, f"no {ALERT} page within {PAGE_BOUND_S} s; trainer said:\n{out[-3000:]}"
    (alert,) = [a for a in page["alerts"] if a["labels"]["alertname"] == ALERT]
    assert (page["receiver"], alert["status"]) == ("ticket", "firing")
    assert (alert["labels"]["run"], alert["labels"]["severity"], alert["labels"]["component"]) == (
        "train-demo", "warning", "training",
    )  # fmt: skip
    assert elapsed < PAGE_BOUND_S
