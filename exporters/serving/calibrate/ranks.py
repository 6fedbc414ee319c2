"""Where each real client percentile falls in the sim's own distribution of the same stage (docs/calibration.md,
*Ranks*): the share of the replay's samples at or below the real value (ties count half). A sim whose
distribution is right puts the real P50 near 0.50 and the real P99 near 0.99, whatever the shape.

Beside the value error this tells a shape error from a knife edge. In a two-user closed loop of equal requests
about half the requests wait out the other user's prefill, so the TTFT distribution has two modes and its
median sits on the edge between them: a few points more or fewer waiting move the P50 by a third of its value
while the distribution barely changed (the rank is a few points off). Likewise a P99 at the edge of a 1 % tail.
A rank far from its quantile is a distribution the sim does not make, such as the real P99 ITL above every
interval the sim produced (rank 1.0: the sim has no such tail).

Usage::

    ranks = percentile_ranks(real_figures, replayed.samples)   # {"median_ttft_ms": Rank(...), ...}
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

PERCENTILES: dict[str, tuple[str, float]] = {
    "median_ttft_ms": ("ttft", 0.50),
    "p99_ttft_ms": ("ttft", 0.99),
    "median_itl_ms": ("itl", 0.50),
    "p99_itl_ms": ("itl", 0.99),
    "median_e2el_ms": ("e2el", 0.50),
    "p99_e2el_ms": ("e2el", 0.99),
}
"""Each client percentile figure: the replay's sample list it is read from, and its quantile."""


@dataclass(frozen=True, slots=True)
class Rank:
    quantile: float
    """The figure's quantile (0.5 for a median)."""
    rank: float
    """The share of the sim's samples at or below the real value (ties count half)."""
    samples: int
    """How many samples the sim's distribution has."""

    @property
    def shift_pp(self) -> float:
        """``rank − quantile`` in percentage points: how far the real percentile sits from where the sim's own
        distribution would put it (+: the real value is higher in the sim's distribution than its quantile)."""
        return (self.rank - self.quantile) * 100

    def as_dict(self) -> dict[str, float | int]:
        return {"quantile": self.quantile, "rank": self.rank, "shift_pp": self.shift_pp, "samples": self.samples}


def rank_of(value: float, ordered: list[float]) -> float:
    """The share of ``ordered`` (sorted) at or below ``value``, ties counting half."""
    below = bisect.bisect_left(ordered, value)
    upto = bisect.bisect_right(ordered, value)
    return (below + 0.5 * (upto - below)) / len(ordered)


def percentile_ranks(real: dict[str, float], samples: dict[str, list[float]]) -> dict[str, Rank]:
    """The rank of each real percentile figure in the sim's samples; figures without a real value or without
    sim samples are left out."""
    ordered = {name: sorted(values) for name, values in samples.items() if values}
    out: dict[str, Rank] = {}
    for key, (name, q) in PERCENTILES.items():
        value = real.get(key)
        if value is None or name not in ordered:
            continue
        out[key] = Rank(q, rank_of(float(value), ordered[name]), len(ordered[name]))
    return out
