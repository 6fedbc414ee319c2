"""vLLM's own step times from its log, by the step's batch (``--enable-logging-iteration-details``).

With that flag vLLM logs one line per engine step: its requests in prefill ("context") and in decode
("generation") and its ``iteration elapsed time``. :func:`decode_steps` reads the steps that only decoded,
grouped by how many requests they decoded, and :func:`summary` gives each group's count and median: the
engine's decode step as a function of the batch, which calibrate's roofline takes to be monotone
(docs/calibration.md, *Limits*). ``python -m benchmarks.calibration_vllm --iteration-details`` prints it after a
sweep; ``python -m benchmarks.vllm_iterations LOG`` reads a saved log.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Iterable

from exporters.serving.calibrate.iteration_log import decode_steps as logged_decode_steps
from exporters.serving.calibrate.iteration_log import parse

EVER = ((-math.inf, math.inf),)


def decode_steps(lines: Iterable[str]) -> dict[int, list[float]]:
    """Elapsed ms of every step without a prefill, by its number of decoding requests (calibrate's reading of
    the log, exporters/serving/calibrate/iteration_log.py, over the whole log)."""
    steps = logged_decode_steps(parse(lines, year=2000), EVER)  # a leap year: any MM-DD stamp is a date
    return {batch: [round(s * 1000, 6) for s in elapsed] for batch, elapsed in steps.items()}


def summary(steps: dict[int, list[float]], least: int = 20) -> list[tuple[int, int, float]]:
    """(batch, steps, median ms) for each batch seen at least ``least`` times, by batch."""
    return [(b, len(v), statistics.median(v)) for b, v in sorted(steps.items()) if len(v) >= least]


def print_summary(lines: Iterable[str]) -> None:
    rows = summary(decode_steps(lines))
    if not rows:
        print("no decode-only steps in the log (was vLLM started with --enable-logging-iteration-details?)")
        return
    print("vLLM's decode-only steps (its iteration log): batch, steps, median ms")
    for batch, count, median in rows:
        print(f"  {batch:5d} {count:7d} {median:9.2f}")


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8", errors="replace") as fh:
        print_summary(fh)
