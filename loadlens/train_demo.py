"""``make train-demo``: LoRA fine-tuning with the training telemetry, watched by the local stack, paging on a
gradient-norm jump.

1. ``loadlens stack up`` (Prometheus scrapes job ``loadlens-training`` on the training port; the GPU exporter
   reads the stack's probe directory).
2. ``python -m exporters.training.demo``: a tiny randomly initialised Llama-shaped model with PEFT LoRA on
   q/v (and its LM head) trains on CPU through ``transformers.Trainer`` with ``LoadlensCallback``; at one
   step the learning rate is spiked, the gradient norm then jumps above 3x its EMA.
3. The demo waits until the pager has received ``LoadlensTrainingGradNormJump`` (bounded) and says what
   arrived and when. The stack stays up; ``loadlens stack down`` stops it. Exit 1 when no page arrived.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadlens.stack.runner import PROBE_DIR, Stack, StackOptions
from loadlens.util.cliutil import UsageError

RUN_DIR = Path(".run/stack")
ALERT = "LoadlensTrainingGradNormJump"
PAGE_WAIT_S = 90  # warning route: group_wait 10 s after the rule fires (scrape and evaluation every 2 s)


def say(text: str = "") -> None:
    print(text, flush=True)


def pages_of(run_dir: Path, alertname: str) -> list[dict[str, Any]]:
    """Notifications the pager wrote (pages.jsonl) that carry ``alertname``."""
    path = run_dir / "pages.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            note = json.loads(line)
        except ValueError:
            continue  # the line the pager is writing as we read (a line across a page boundary shows in two parts)
        if any(a.get("labels", {}).get("alertname") == alertname for a in note.get("alerts", [])):
            out.append(note)
    return out


def wait_for_page(run_dir: Path, alertname: str, timeout_s: float, *, after: int = 0) -> dict[str, Any] | None:
    """The first notification for ``alertname`` beyond the ``after`` already there, or None by the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pages = pages_of(run_dir, alertname)
        if len(pages) > after:
            return pages[after]
        time.sleep(0.5)
    return None


def training_command(options: StackOptions, *, steps: int, spike_step: int, step_seconds: float) -> list[str]:
    return [
        sys.executable, "-m", "exporters.training.demo", "--port", str(options.training_port),
        "--steps", str(steps), "--spike-step", str(spike_step), "--step-seconds", str(step_seconds),
        "--linger", "30", "--output-dir", str(options.run_dir / "train-demo"),
    ]  # fmt: skip


def main() -> int:
    options = StackOptions(run_dir=RUN_DIR)
    stack = Stack(options, say=say)
    stack.down()  # a stack left by an earlier demo: start fresh
    try:
        services = stack.up()
    except UsageError as err:
        say(f"train-demo: the stack did not start: {err}")
        return 1
    urls = {s.name: s.url for s in services}
    before = len(pages_of(RUN_DIR, ALERT))
    env = {**os.environ, "LOADLENS_PROBE_DIR": str((RUN_DIR / PROBE_DIR).resolve())}
    cmd = training_command(options, steps=80, spike_step=40, step_seconds=0.5)
    say(f"train-demo: training with the telemetry callback: {' '.join(cmd[1:])}")
    started = time.monotonic()
    trainer = subprocess.Popen(cmd, env=env)
    page = wait_for_page(RUN_DIR, ALERT, PAGE_WAIT_S + 80 * 0.5, after=before)
    trainer.wait(timeout=120)
    if page is None:
        say(f"\ntrain-demo: no {ALERT} page within the bound; see {RUN_DIR}/ and {urls['prometheus']}/classic/alerts")
        return 1
    alert = next(a for a in page["alerts"] if a["labels"].get("alertname") == ALERT)
    elapsed = time.monotonic() - started
    say(f"\ntrain-demo: paged {elapsed:.0f} s after training started: receiver {page['receiver']}, {alert['status']} "
        f"{ALERT} (run {alert['labels'].get('run')}): {alert['annotations'].get('description')}")  # fmt: skip
    say(f"  Prometheus    {urls['prometheus']}/classic/graph (try loadlens_training_grad_norm)")
    say(f"  pages         {RUN_DIR / 'pages.jsonl'}")
    say("  stop it all   .venv/bin/loadlens stack down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
