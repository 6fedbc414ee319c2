"""What both experiment commands (the serving experiments' and the training ones') take from the command line
before anything runs: the repeats and the run's directory name, each refused with one line naming the flag."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from loadlens.util.cliutil import UsageError


def repeats_and_run_id(args: argparse.Namespace, name: str, default_repeats: int) -> tuple[int, str]:
    """``--repeats`` (1 to 100, else the experiment's) and ``--run-id`` (a plain directory name, required by
    ``--resume``; else ``NAME-<UTC time>``)."""
    if args.repeats is not None and not 1 <= args.repeats <= 100:
        raise UsageError(f"--repeats: must be in [1, 100], got {args.repeats}")
    if args.resume and not args.run_id:
        raise UsageError("--resume needs --run-id (the experiment directory to continue)")
    run_id = args.run_id or f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    if "/" in run_id or run_id in (".", ".."):
        raise UsageError(f"--run-id must be a plain directory name, got {run_id!r}")
    return args.repeats or default_repeats, run_id
