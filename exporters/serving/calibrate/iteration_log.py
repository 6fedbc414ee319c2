"""vLLM's own step log as fit rows for ``loadlens calibrate --iteration-log`` (docs/calibration.md, *The
iteration rows*).

Started with ``--enable-logging-iteration-details``, vLLM logs one line per engine step: its requests in
prefill ("context") and in decode ("generation") and the step's elapsed time, stamped with the second it was
logged in the server's local time. A stage's mean ITL holds its decodes' stalls behind prefills, so the stage
rows cannot see how the decode step itself grows with the batch (a plateau while the weights' read dominates,
then a slope); these rows can: for each fitted stage and each batch of at least ``LEAST`` decode-only steps
logged inside the stage's runs, their mean (as the stage rows take means), in the sim's formula a step of that
many decodes at the stage's mean context. A step counts for a run when its second lies wholly inside the run's
span.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporters.serving.calibrate.fit import Row, mixed_step
from exporters.serving.calibrate.observations import CalibrationInputError, Stage
from loadlens.contracts.model_profile import ModelProfile

STEP = re.compile(
    r"(?P<month>\d\d)-(?P<day>\d\d) (?P<clock>\d\d:\d\d:\d\d) .*Iteration\(\d+\): (?P<context>\d+) context "
    r"requests, \d+ context tokens, (?P<decode>\d+) generation requests, \d+ generation tokens, iteration "
    r"elapsed time: (?P<ms>[\d.]+) ms"
)
LEAST = 20
"""Decode-only steps of one batch in one stage below which the batch gives no row (a mean of a few steps is
one step's noise)."""
OBSERVABLE = "mean decode step"


@dataclass(frozen=True, slots=True)
class LoggedStep:
    second: float
    """The epoch second the step was logged in (vLLM's stamp, read in this host's time zone)."""
    prefills: int
    decodes: int
    elapsed_s: float


def parse(lines: Iterable[str], year: int) -> list[LoggedStep]:
    """The steps of a vLLM log; its stamps carry no year, so ``year`` is the runs'."""
    steps = []
    for line in lines:
        m = STEP.search(line)
        if m is None:
            continue
        stamp = time.strptime(f"{year}-{m['month']}-{m['day']} {m['clock']}", "%Y-%m-%d %H:%M:%S")
        steps.append(LoggedStep(time.mktime(stamp), int(m["context"]), int(m["decode"]), float(m["ms"]) / 1000))
    return steps


def decode_steps(steps: Iterable[LoggedStep], windows: Sequence[tuple[float, float]]) -> dict[int, list[float]]:
    """Elapsed seconds of the decode-only steps logged wholly inside one of ``windows``, by batch."""
    out: dict[int, list[float]] = {}
    for step in steps:
        if step.prefills or not step.decodes:
            continue
        if any(start <= step.second and step.second + 1 <= end for start, end in windows):
            out.setdefault(step.decodes, []).append(step.elapsed_s)
    return out


def read_steps(path: str, stages: Sequence[Stage]) -> list[LoggedStep]:
    """The log's steps, dated in the year of the stages' first run; one-line errors for a log that cannot be
    read or holds no step line, or stages without run spans."""
    spans = [w for s in stages for w in s.windows]
    if not spans:
        raise CalibrationInputError(f"--iteration-log {path}: the runs carry no start and end times to place steps in")
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            steps = parse(fh, time.localtime(min(start for start, _ in spans)).tm_year)
    except OSError as err:
        raise CalibrationInputError(f"--iteration-log {path}: cannot read it ({err.strerror})") from None
    if not steps:
        raise CalibrationInputError(
            f"--iteration-log {path}: no step lines (was vLLM started with --enable-logging-iteration-details?)"
        )
    return steps


def decode_row(model: ModelProfile, stage: Stage, batch: int) -> Row:
    """A logged decode-only step of ``batch`` sequences in ``stage``: at the stage's mean context."""
    context = stage.prompt_tokens + (stage.output_tokens - 1) / 2
    return Row(((1.0, mixed_step(model, float(batch), 0.0, stage.prompt_tokens, context)),), logged=True)


def iteration_rows(
    model: ModelProfile, stages: Sequence[Stage], steps: Sequence[LoggedStep], path: str = "the log"
) -> list[tuple[str, str, Row, float]]:
    """(stage, observable, row, observed seconds): per stage and batch with at least ``LEAST`` decode-only steps
    in the stage's runs, their mean, as a step of that many decodes at the stage's mean context. Raises when
    no stage has any step in its runs (the log is another server's, or its clock in another time zone)."""
    rows: list[tuple[str, str, Row, float]] = []
    seen = 0
    for stage in stages:
        by_batch = decode_steps(steps, stage.windows)
        seen += sum(map(len, by_batch.values()))
        for batch, elapsed in sorted(by_batch.items()):
            if len(elapsed) >= LEAST:
                row = decode_row(model, stage, batch)
                rows.append((stage.name, f"{OBSERVABLE} b={batch}", row, statistics.fmean(elapsed)))
    if not seen:
        first, last = (time.strftime("%m-%d %H:%M:%S", time.localtime(f(s.second for s in steps))) for f in (min, max))
        raise CalibrationInputError(
            f"--iteration-log {path}: none of its decode-only steps ({first} to {last}, read in this host's time "
            "zone) falls in the fitted stages' runs: another server's log, or its clock in another zone"
        )
    return rows
