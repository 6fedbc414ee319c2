"""One calibration sweep against the real vLLM CPU rig (docs/calibration.md).

Run: ``python -m benchmarks.calibration_vllm [--results DIR] [--run-id ID] [--shape calibration|tiny] [--time-scale
X] [--repeats N] [--sample-interval S] [--iteration-details]`` (needs ``.venv-vllm``, docs/real-vllm.md). It builds
the model of the shape (``tests/support/vllm_model.py``; default ``calibration``, 47.2M parameters, whose engine
steps are long enough for vLLM to stream each token on the 2-core machine; ``tiny`` is the test suite's), starts one
vLLM (``tests/support/vllm_server.py``: its own process group, killed on exit), runs ``loadlens experiment
calibration-sweep --host URL --model tiny-llama`` against it and prints the experiment's result path and the
``loadlens calibrate`` command that fits the sim to it, with the shape's model profile (``benchmarks/calibration/``)
and the rig's scheduler limits (``vllm_server.SCHEDULER_LIMITS``). With ``--iteration-details`` vLLM logs each step
and the decode steps' medians by batch are printed after (``benchmarks/vllm_iterations.py``), and the
calibrate command reads the log (``--iteration-log``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.vllm_iterations import print_summary
from tests.support import vllm_server as rig
from tests.support.paths import ROOT
from tests.support.vllm_model import SERVED_NAME, SHAPES, rig_model
from tests.support.vllm_server import vllm_server

MODEL_PROFILES = {"tiny": "tiny-llama.yaml", "calibration": "small-llama.yaml"}
"""Each shape's sim model profile under benchmarks/calibration/ (tests/calibrate/test_rig_profiles.py)."""


HOLD_OUT = ("c4-p128", "p192-c2")
"""The stages the rig's fits hold out (docs/calibration.md, section 4), where the sweep ran them."""


def hold_out_flag(result: Path) -> str:
    """`` --hold-out ...`` with those of HOLD_OUT that the sweep ran (its --param can leave them out)."""
    try:
        doc = json.loads((result / "experiment_result.json").read_text(encoding="utf-8"))
        ran = {t.get("name") for t in doc.get("trials", [])}
    except (OSError, ValueError, AttributeError):
        ran = set(HOLD_OUT)
    held = [name for name in HOLD_OUT if name in ran]
    return f" --hold-out {' '.join(held)}" if held else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default="results")
    p.add_argument("--run-id", default="calibration-vllm")
    p.add_argument("--time-scale", default="1")
    p.add_argument("--param", action="append", default=[], help="passed on to the experiment")
    p.add_argument("--repeats", type=int, default=None, help="runs per stage (passed on to the experiment)")
    p.add_argument("--sample-interval", type=float, default=None, help="seconds between /metrics reads (passed on)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="calibration", help="the served model's shape")
    p.add_argument("--iteration-details", action="store_true", help="start vLLM with --enable-logging-iteration-"
                   "details and print its decode steps' medians by batch after the sweep")  # fmt: skip
    args = p.parse_args(argv)
    model = rig_model(args.shape)
    log = Path(args.results) / "experiments" / f"{args.run_id}-vllm.log"
    extra = ["--enable-logging-iteration-details"] if args.iteration_details else []
    with vllm_server(model, log_path=log, extra_args=extra) as server:
        print(f"vLLM healthy at {server.url} after {server.startup_s:.1f} s (log {log})", flush=True)
        cmd = [sys.executable, "-m", "loadlens.cli", "experiment", "calibration-sweep", "--host", server.url,
               "--model", SERVED_NAME, "--results", args.results, "--run-id", args.run_id,
               "--time-scale", args.time_scale]  # fmt: skip
        for param in args.param:
            cmd += ["--param", param]
        if args.repeats is not None:
            cmd += ["--repeats", str(args.repeats)]
        if args.sample_interval is not None:
            cmd += ["--sample-interval", f"{args.sample_interval:g}"]
        code = subprocess.call(cmd, cwd=ROOT)
    result = Path(args.results) / "experiments" / args.run_id
    print(f"result: {result / 'experiment_result.json'}")
    if args.iteration_details:
        with log.open(encoding="utf-8", errors="replace") as fh:
            print_summary(fh)
    profile = ROOT / "benchmarks" / "calibration" / MODEL_PROFILES[args.shape]
    print(
        f"fit: loadlens calibrate {result} --model-profile {profile.relative_to(ROOT)}{hold_out_flag(result)}"
        f" --max-num-seqs {rig.SCHEDULER_LIMITS['max_num_seqs']}"
        f" --max-num-batched-tokens {rig.SCHEDULER_LIMITS['max_num_batched_tokens']}"
        f" --profile {args.run_id}.yaml --json {args.run_id}.json"
        + (f" --iteration-log {log}" if args.iteration_details else "")
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
