"""vLLM's per-step log line, written by the sim (``loadlens serve --engine sim
--enable-logging-iteration-details``, vLLM's flag of the same name).

vLLM 0.32 started with that flag logs one line per engine step from its API server's stat logger, once the
step's outputs reach it (``vllm/v1/metrics/loggers.py``, ``_log_iteration_details``)::

    INFO 12-06 04:20:58 [loggers.py:199] Engine 000: Iteration(1): 0 context requests, 0 context tokens,
    3 generation requests, 3 generation tokens, iteration elapsed time: 8.62 ms, GPU KV cache usage: 0.1%

(one line in the log). A request is counted in context while it has no output token (``vllm/v1/utils.py``,
``compute_iteration_details``), and the elapsed time runs from after the step's dispatch to its model output
(``vllm/v1/engine/core.py``, ``capture_iteration_details``): the scheduling before and the output handling after
are not in it. The sim writes the same line for each step it runs: its batch's counts, the step's time after
its host overhead (the model's run), the KV usage after the step, stamped when the step ends in this host's
local time to the second, as vLLM's logger stamps it; so what reads vLLM's log (``loadlens calibrate
--iteration-log``) reads the sim's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from exporters.serving.engines.sim.stats import EngineEvent, EngineStats, StepStats

PLACE = "[loggers.py:199]"
"""vLLM 0.32's logger and line, as its log names them."""


class IterationDetailsLogger:
    """A stat logger (``stats.StatLogger``) that writes vLLM's iteration line through ``write`` after each step;
    ``clock`` gives the epoch seconds stamped (a test's virtual clock), ``device`` the KV cache's ("GPU", or
    "CPU" as vLLM's CPU build says)."""

    def __init__(self, write: Callable[[str], None], clock: Callable[[], float] = time.time, device: str = "GPU"):
        self._write = write
        self._clock = clock
        self._device = device
        self._planned: StepStats | None = None
        self._index = 0

    def record_step(self, step: StepStats) -> None:
        self._planned = step

    def record(self, stats: EngineStats) -> None:
        step = self._planned
        if stats.iteration is None or step is None:
            return
        self._planned = None
        ctx, ctx_tokens, gen, gen_tokens = step.counts
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(self._clock()))
        self._write(
            f"INFO {stamp} {PLACE} Engine 000: Iteration({self._index}): {ctx} context requests, {ctx_tokens} "
            f"context tokens, {gen} generation requests, {gen_tokens} generation tokens, iteration elapsed time: "
            f"{step.busy_seconds * 1000:.2f} ms, {self._device} KV cache usage: "
            f"{stats.scheduler.kv_cache_usage * 100:.1f}%"
        )
        self._index += 1

    def record_event(self, event: EngineEvent) -> None:
        """Not in the line."""
