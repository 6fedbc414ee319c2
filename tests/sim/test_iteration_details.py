"""vLLM's per-step log line written by the sim (exporters/serving/engines/sim/iteration_details.py): the line
vLLM 0.32 writes, its counts as vLLM counts them, and ``loadlens serve``'s flag."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from exporters.serving.calibrate.iteration_log import LoggedStep, parse
from exporters.serving.cli import build_engine
from exporters.serving.engines.sim.iteration_details import IterationDetailsLogger
from exporters.serving.engines.sim.stats import AdapterRead, EngineStats, IterationStats, SchedulerStats, StepStats

# A line of the rig's vLLM 0.32 log (CPU build), the API server's process prefix dropped.
VLLM = (
    "INFO 12-06 04:20:58 [loggers.py:199] Engine 000: Iteration(1): 0 context requests, 0 context tokens, 3 "
    "generation requests, 3 generation tokens, iteration elapsed time: 8.62 ms, CPU KV cache usage: 0.1%"
)


def _after(kv: float) -> EngineStats:
    return EngineStats(SchedulerStats(3, 0, 0, kv), None, iteration=IterationStats())


def test_the_line_is_vllms_with_the_steps_counts_time_and_kv_usage() -> None:
    lines: list[str] = []
    stamp = time.mktime(time.strptime("2026-12-06 04:20:58", "%Y-%m-%d %H:%M:%S")) + 0.7
    logger = IterationDetailsLogger(lines.append, clock=lambda: stamp, device="CPU")
    logger.record(_after(0.001))  # no step planned yet: nothing
    logger.record_step(StepStats(0.2, 2, busy_seconds=0.14111, counts=(1, 240, 1, 1)))
    logger.record(EngineStats(SchedulerStats(3, 0, 0, 0.001), None))  # not a step's end: nothing yet
    logger.record(_after(0.001))
    logger.record_step(StepStats(0.0107, 3, busy_seconds=0.008624, counts=(0, 0, 3, 3)))
    logger.record(_after(0.0012))
    assert lines[1] == VLLM
    assert lines[0] == (
        "INFO 12-06 04:20:58 [loggers.py:199] Engine 000: Iteration(0): 1 context requests, 240 context tokens, 1 "
        "generation requests, 1 generation tokens, iteration elapsed time: 141.11 ms, CPU KV cache usage: 0.1%"
    )
    # What reads vLLM's log reads the sim's.
    assert parse(lines, 2026) == [
        LoggedStep(stamp - 0.7, 1, 1, 0.14111),
        LoggedStep(stamp - 0.7, 0, 3, 0.00862),
    ]
    # A sporadic event is not a step: no line.
    logger.record_event(AdapterRead(0.01))
    logger.record(_after(0.0012))
    assert len(lines) == 2


def test_serve_writes_a_line_per_step_with_the_flag_and_refuses_it_for_the_proxy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from prometheus_client import CollectorRegistry

    from loadlens.cli import build_parser, main

    engine = build_engine(build_parser().parse_args(["serve", "--enable-logging-iteration-details"]),
                          CollectorRegistry())  # fmt: skip
    assert [type(s) for s in engine._stats.loggers][1:] == [IterationDetailsLogger]
    plain = build_engine(build_parser().parse_args(["serve"]), CollectorRegistry())
    assert not hasattr(plain._stats, "loggers")  # the Prometheus logger alone
    assert main(["serve", "--engine", "openai", "--upstream", "http://x:1", "--enable-logging-iteration-details"]) == 2
    assert capsys.readouterr().err.strip() == (
        "loadlens serve: error: --enable-logging-iteration-details applies to the sim engine only; start the "
        "upstream vLLM with it"
    )


def test_the_engines_steps_are_counted_as_vllm_counts_them(tmp_path: Path) -> None:
    """One user, 240-token prompts, a 64-token step budget: each prompt is four context steps (64, 64, 64, 48
    tokens: chunked prefill, in context until its first token), then its decodes one generation request each."""
    from exporters.serving.calibrate.replay import StageLoad, replay
    from tests.calibrate.known import hidden_profile, model

    lines: list[str] = []
    load = StageLoad(1, 240, 8, 0.5, warmup_s=0.1)
    replay(model(), hidden_profile(tmp_path), load, knobs={"max_num_batched_tokens": 64, "max_num_seqs": 16},
           loggers=lambda clock: [IterationDetailsLogger(lines.append, clock=clock)])  # fmt: skip
    counts = [re.search(r"Iteration\(\d+\): (.*) tokens, iteration", line)[1] for line in lines[:12]]  # type: ignore[index]
    prefill = [f"1 context requests, {n} context tokens, 0 generation requests, 0 generation" for n in (64, 64, 64, 48)]
    decode = ["0 context requests, 0 context tokens, 1 generation requests, 1 generation"] * 7
    assert counts == prefill + decode + prefill[:1]
    assert [int(re.search(r"Iteration\((\d+)\)", line)[1]) for line in lines] == list(range(len(lines)))  # type: ignore[index]
