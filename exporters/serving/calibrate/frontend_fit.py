"""The API-server (frontend) fit of ``loadlens calibrate`` (docs/calibration.md, *The frontend rows*).

vLLM stamps a request's arrival in its API server before input processing and ends its TTFT when its API
server's output handler sees the first token; its queue and prefill intervals are engine-core stamps, and its
engine core stamps a request queued when its loop takes it in, between steps. So per stage, vLLM's TTFT mean
minus its queue and prefill means is the time outside the engine core (rendering, tokenization, the hops to
the engine core and back, output processing) plus the wait of a request that arrived during a step. The sim's
frontend stage (exporters/serving/engines/sim/frontend.py) models the first as

    gap = frontend_fixed + frontend_per_running · R

R the stage's mean running requests (Little's law, :func:`.fit.running`); the second the sim already makes,
in its queue (it queues a request on entry). So the rows take the gap over the sim's own queue mean, from a
replay of the stage on the step fit's profile (:func:`fit_frontend_replayed`), not over vLLM's. Weighted least
squares, each row divided by the stage's TTFT mean (a residual counts as its share of the TTFT the sim
predicts), with the step fit's identification rules (:func:`.fit.linear_fit`): one stage, or stages of one R,
leave the per-running cost not identified (one with the fixed cost). vLLM's series cannot split the fixed
cost between input and output (it is in TTFT and in E2E alike), and a constant split moves nothing the sim
predicts, so it is one parameter, spent before the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from exporters.serving.calibrate.fit import linear_fit, running
from exporters.serving.calibrate.observations import Stage
from exporters.serving.calibrate.replay import replay, stage_load
from loadlens.contracts.gpu_profile import GPUProfile
from loadlens.contracts.model_profile import ModelProfile

FRONTEND_PARAMS = ("frontend_fixed_s", "frontend_per_running_s")
"""The fit's names; the profile's fields are ``frontend_fixed_seconds`` and ``frontend_per_running_seconds``."""
SPLIT = (
    "vLLM's series cannot tell its input part from its output part (both are in TTFT and E2E); "
    "the sim spends it before the waiting queue, which predicts the same"
)
"""Said beside ``frontend_fixed_s`` wherever calibrate reports it."""
QUEUE = "vllm:request_queue_time_seconds"
REPLAY_ROUNDS = 2
"""Fits over the sim's queue (:func:`fit_frontend_replayed`): the first over a replay without the frontend, the
second over one with the first fit's."""


@dataclass(slots=True)
class FrontendFit:
    values: dict[str, float]
    stderr: dict[str, float]
    not_identified: dict[str, str] = field(default_factory=dict)
    rows: list[tuple[str, float, float, float]] = field(default_factory=list)
    """(stage, mean running, observed gap s, fitted gap s)."""
    queues: dict[str, float] = field(default_factory=dict)
    """Per stage, the queue mean (s) the gap was taken over: the sim's own, from a replay
    (:func:`fit_frontend_replayed`), else vLLM's."""

    def predict(self, mean_running: float) -> float:
        return self.values["frontend_fixed_s"] + self.values["frontend_per_running_s"] * mean_running


def gap(stage: Stage, queue: float | None = None) -> float | None:
    """vLLM's TTFT mean minus its prefill mean and ``queue`` (default: vLLM's queue mean), seconds; None
    without those series."""
    ttft = stage.server_mean("vllm:time_to_first_token_seconds")
    queue = stage.server_mean(QUEUE) if queue is None else queue
    prefill = stage.server_mean("vllm:request_prefill_time_seconds")
    if ttft is None or queue is None or prefill is None:
        return None
    return ttft - queue - prefill


def fit_frontend(
    stages: Sequence[Stage],
    fixed: Sequence[str] = (),
    say: Callable[[str], None] = lambda _: None,
    queues: Mapping[str, float] | None = None,
) -> FrontendFit:
    """The frontend parameters over the stages that have the series; ``fixed`` ones are held at 0. ``queues``:
    per stage the queue mean to take the gap over instead of vLLM's (the sim's own, see
    :func:`fit_frontend_replayed`)."""
    queues = dict(queues or {})
    rows = [(s.name, running(s), g, ttft) for s in stages
            if (g := gap(s, queues.get(s.name))) is not None
            and (ttft := s.server_mean("vllm:time_to_first_token_seconds"))]  # fmt: skip
    held = [p for p in FRONTEND_PARAMS if p in fixed]
    if not rows:
        why = "no stage has vLLM's TTFT, queue and prefill series"
        return FrontendFit(dict.fromkeys(FRONTEND_PARAMS, 0.0), dict.fromkeys(FRONTEND_PARAMS, 0.0),
                           {p: "held at 0 (--fix)" if p in held else why for p in FRONTEND_PARAMS})  # fmt: skip
    weight = np.array([t for *_, t in rows])
    x = np.array([[1.0, r] for _, r, _, _ in rows]) / weight[:, None]
    y = np.array([g for _, _, g, _ in rows]) / weight
    say(f"calibrate: frontend fit: {len(rows)} rows (vLLM's TTFT − queue − prefill means)")
    got = linear_fit(x, y, held, say, names=FRONTEND_PARAMS, zero_column="no stage ran any request (R is 0)")
    result = FrontendFit(got.values, got.stderr, got.not_identified)
    result.rows = [(name, r, g, result.predict(r)) for name, r, g, _ in rows]
    result.queues = {s.name: q for s in stages if (q := queues.get(s.name, s.server_mean(QUEUE))) is not None}
    return result


def with_frontend(gpu: GPUProfile, frontend: FrontendFit) -> GPUProfile:
    """``gpu`` with the frontend fit's fields (the step fit's profile, in memory, for a replay)."""
    v = frontend.values
    return gpu.model_copy(update={"frontend_fixed_seconds": v["frontend_fixed_s"],
                                  "frontend_per_running_seconds": v["frontend_per_running_s"]})  # fmt: skip


def fit_frontend_replayed(
    model: ModelProfile,
    gpu: GPUProfile,
    stages: Sequence[Stage],
    fixed: Sequence[str] = (),
    say: Callable[[str], None] = lambda _: None,
    client_overhead_s: Callable[[Stage], tuple[float, float]] = lambda _: (0.0, 0.0),
) -> FrontendFit:
    """The frontend fit over the sim's own queue means. vLLM stamps a request queued when its engine core's
    loop takes it in, between steps, so the wait of a request that arrives during a step is in vLLM's gap,
    not in its queue; the sim queues a request on entry, so its queue holds that wait. Taking vLLM's gap as
    the frontend would count the wait twice. So each stage is replayed on ``gpu`` (the step fit's profile) and
    the gap is vLLM's TTFT mean minus its prefill mean minus the sim's queue mean; then again with the
    frontend so fitted (where the requests enter the engine moves the wait), and the second fit is kept."""
    if all(p in fixed for p in FRONTEND_PARAMS):
        return fit_frontend(stages, fixed, say)
    current, result = gpu, None
    for rnd in range(1, REPLAY_ROUNDS + 1):
        queues: dict[str, float] = {}
        for s in stages:
            say(f"calibrate: frontend round {rnd}: replaying {s.name} for the sim's queue")
            outside, turnaround = client_overhead_s(s)
            figures = replay(model, current, stage_load(s), client_overhead_s=outside, turnaround_s=turnaround).figures
            queue_ms = figures.get("server_mean_queue_ms")
            if queue_ms is not None:
                queues[s.name] = queue_ms / 1000
        result = fit_frontend(stages, fixed, say, queues)
        current = with_frontend(gpu, result)
    assert result is not None
    return result
