"""A planned step's instants on the loop's clock: the roofline cost of its batch, adapter activations that
stall it first, the jitter factor and ``speed``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from exporters.serving.engines.sim import roofline
from exporters.serving.engines.sim.profile import GPUProfile
from exporters.serving.engines.sim.roofline import StepCost
from exporters.serving.engines.sim.sched_types import ScheduledBatch
from loadlens.contracts.model_profile import ModelProfile


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
) -> PricedStep:
    """``factor`` scales every modeled second (jitter; 1.0 without); wall = modeled x factor / speed.
    ``insertion_overhead`` (modeled s) is host time added when the step admits waiting requests."""
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
    end = start + cost.total_seconds * factor / speed
    stall_end = start + stall * factor / speed
    busy_start = stall_end + cost.overhead_seconds * factor / speed
    return PricedStep(cost, start, stall_end, busy_start, end, tuple(loads))
