"""A planned step's instants on the loop's clock: the roofline cost of its batch, adapter activations that
stall it first, the step's noise factor (the profile's measured spread and the ``jitter`` knob) and
``speed``."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from exporters.serving.engines.sim import roofline
from exporters.serving.engines.sim.profile import GPUProfile
from exporters.serving.engines.sim.roofline import StepCost
from exporters.serving.engines.sim.sched_types import ScheduledBatch
from exporters.serving.engines.sim.tokenizer import stable_seed
from loadlens.contracts.model_profile import ModelProfile


class StepNoise:
    """What each step's modeled seconds become: ``modeled × exp(N(0, jitter)) + spread``, the factor the
    ``--jitter`` knob's lognormal (median 1; 1.0 without), the spread one of the GPU profile's
    ``step_spread_seconds`` drawn at random (mean 0: a measured engine's steps around their mean; 0.0
    without). Each has its own seeded stream, so a profile with a spread leaves the jitter's draws as they
    were."""

    def __init__(self, jitter: float, spread_seconds: Sequence[float], seed: int) -> None:
        self.jitter = jitter
        self.spread_seconds = tuple(spread_seconds)
        self._jitter_rng = random.Random(stable_seed("jitter", seed))
        self._spread_rng = random.Random(stable_seed("step_spread", seed))

    def draw(self) -> tuple[float, float]:
        """(factor, seconds added) for the next step."""
        factor = math.exp(self._jitter_rng.gauss(0.0, self.jitter)) if self.jitter else 1.0
        spread = self.spread_seconds
        return factor, spread[self._spread_rng.randrange(len(spread))] if spread else 0.0


@dataclass(frozen=True, slots=True)
class PricedStep:
    cost: StepCost
    """Modeled seconds (before jitter and ``speed``)."""
    start: float
    stall_end: float
    """End of the adapter activations (the compute stream waits for them)."""
    busy_start: float
    """End of the host overhead: kernels run from here to ``end``."""
    end: float
    adapter_loads: tuple[tuple[str, float], ...]
    """(source, wall seconds) of each activation: ``storage`` after a host-cache miss, else ``host``."""


def price_step(
    model: ModelProfile,
    gpu: GPUProfile,
    batch: ScheduledBatch,
    *,
    start: float,
    speed: float,
    factor: float,
    insertion_overhead: float = 0.0,
    spread_seconds: float = 0.0,
) -> PricedStep:
    """``factor`` scales every modeled second (jitter; 1.0 without), the GPU profile's offset for a decode-only
    step of this batch included, and ``spread_seconds`` (modeled s, either sign) is added to the step's run:
    wall = ((modeled + offset) x factor + spread) / speed, the step never ending before its host overhead
    does. ``insertion_overhead`` (modeled s) is host time added when the step admits waiting
    requests."""
    stall = 0.0
    loads: list[tuple[str, float]] = []
    for load in batch.adapter_loads:
        seconds = roofline.adapter_activate_seconds(gpu, load.adapter.nbytes, from_disk=load.from_disk)
        stall += seconds
        # Unjittered, as the old loop observed it.
        loads.append(("storage" if load.from_disk else "host", seconds / speed))
    cost = roofline.step_cost(model, gpu, batch.shape, stall_seconds=stall)
    if insertion_overhead and batch.num_admitted:
        cost = dataclasses.replace(cost, overhead_seconds=cost.overhead_seconds + insertion_overhead)
    stall_end = start + stall * factor / speed
    busy_start = stall_end + cost.overhead_seconds * factor / speed
    # A measured engine's departure from the formula at this batch (decode-only steps: where vLLM's log
    # measured it), and the spread, are in the model's run, where that log timed them: never a run below 0.
    offset = 0.0
    if gpu.decode_step_offsets_seconds and batch.iteration_counts()[0] == 0:
        offset = gpu.decode_step_offset(len(batch.reqs))
    end = max(busy_start, start + ((cost.total_seconds + offset) * factor + spread_seconds) / speed)
    return PricedStep(cost, start, stall_end, busy_start, end, tuple(loads))
