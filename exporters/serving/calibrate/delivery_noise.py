"""The spread a host adds to the intervals between tokens on their way to the client, as ``loadlens calibrate``
models it for its replay (docs/calibration.md, *Delivery noise*).

vLLM's engine makes a decode step's tokens at an even pace, but the client sees them after its API server and
its own process got the CPU: on the 2-core rig the client's ITL P99 was 1.5 to 1.9 times its median at every
load while the engine's steps barely varied. The replay draws, for each token event, a delay from an
exponential of mean ``m`` after the engine made it (never overtaking the previous event), so the client's
interval is the step plus the difference of two such delays: symmetric around the step (the median stays the
engine's) with a P99 ``m · ln 50`` above it. The mean delay is already in the time outside vLLM
(``client_overhead.py``: the client's mean E2E minus vLLM's), so the replay waits that much less before the
arrival.

``m`` is fitted per fitted stage as the client ITL's P99 − P50 on the real server minus the same in a replay
without the noise, over ``ln 50``, never below 0, and the median over the stages is used. A stage whose replay
without noise already has its P99 on the engine's own long intervals (more than ``STALL_SPREAD`` above its
median, beyond what the profile's step spread alone puts there: decodes that waited out another request's
prefill, about 1 % of them in a 2-user stage) is left out:
there the P99 sits on a knife edge between the steps and the stalls, and noise moves it either way
(docs/calibration.md, *Ranks*). Where every stage is such, all are used. Like the client overhead it is not
in the profile: ``loadlens serve`` streams through an HTTP layer of its own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

LN50 = math.log(50)
"""P99 of the difference of two independent exponentials of mean 1 (a Laplace of scale 1)."""


STALL_SPREAD = 0.10
"""A replay's ITL P99 this far above its P50 (relative) is on the engine's stalls, not on its steps."""


@dataclass(frozen=True, slots=True)
class DeliveryNoise:
    mean_s: float
    """The exponential's mean, seconds (0: none)."""
    per_stage_s: dict[str, float]
    """Each fitted stage's estimate, seconds, the ones used and the ones left out."""
    note: str
    left_out: tuple[str, ...] = ()
    """Stages whose replay has its ITL P99 on the engine's stalls (not in the median)."""


def spread(figures: Mapping[str, float | None]) -> float | None:
    """The client ITL's P99 − P50, seconds; None without both."""
    p50, p99 = figures.get("median_itl_ms"), figures.get("p99_itl_ms")
    return (p99 - p50) / 1000 if p50 is not None and p99 is not None else None


def fit_delivery_noise(
    real: Mapping[str, Mapping[str, float | None]],
    quiet: Mapping[str, Mapping[str, float | None]],
    step_spread_s: float = 0.0,
) -> DeliveryNoise:
    """``real`` and ``quiet``: each fitted stage's client figures on the server and in a replay without the
    noise; ``step_spread_s``: the P99 − P50 of the profile's step spread (seconds), which every replay's
    intervals have without any stall."""
    per_stage: dict[str, float] = {}
    stalled: list[str] = []
    for name, figures in real.items():
        sim = quiet.get(name, {})
        r, q, q50 = spread(figures), spread(sim), sim.get("median_itl_ms")
        if r is None or q is None or not q50:
            continue
        per_stage[name] = max(0.0, r - q) / LN50
        if q > STALL_SPREAD * q50 / 1000 + step_spread_s:
            stalled.append(name)
    if not per_stage:
        return DeliveryNoise(0.0, {}, "none: no fitted stage has the client's ITL P50 and P99 (0 used)")
    used = [v for k, v in per_stage.items() if k not in stalled] or list(per_stage.values())
    left_out = tuple(stalled) if len(used) < len(per_stage) else ()
    mean = statistics.median(used)
    note = (
        f"{mean * 1000:.3g} ms mean, the median over {len(used)} fitted stages of (client ITL P99 − P50, "
        "real − replay without it) / ln 50"
    )
    if left_out:
        note += f"; left out, their replay's P99 on the engine's stalls: {', '.join(left_out)}"
    return DeliveryNoise(mean, per_stage, note, left_out)
