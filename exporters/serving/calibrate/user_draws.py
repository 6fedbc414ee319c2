"""What a closed-loop user of the load generator draws per request, as calibrate's replay draws it again: the
output length it asks and its think time after the answer. The load generator draws each from a normal and
clamps it into [min, max] (loadgen's ``LengthDist`` and ``SecondsDist``; a length is rounded, at least 1), so
clamped draws have a mean of their own (:meth:`Clamped.expected`), which is what calibrate takes out of a
user's cycle (client_overhead.py). docs/calibration.md, *Why the loads are drawn*."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


def _cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def _pdf(z: float) -> float:
    return math.exp(-z * z / 2) / math.sqrt(2 * math.pi) if math.isfinite(z) else 0.0


@dataclass(frozen=True, slots=True)
class Clamped:
    """A normal(mean, stdev) clamped into [low, high]; a zero stdev is the mean itself (clamped)."""

    mean: float
    stdev: float = 0.0
    low: float = 0.0
    high: float = math.inf

    def draw(self, rng: random.Random) -> float:
        value = self.mean if self.stdev <= 0 else rng.gauss(self.mean, self.stdev)
        return min(self.high, max(self.low, value))

    def expected(self) -> float:
        """The draws' mean: the normal's mass below ``low`` sits at ``low``, above ``high`` at ``high``."""
        if self.stdev <= 0:
            return min(self.high, max(self.low, self.mean))
        a = (self.low - self.mean) / self.stdev
        b = (self.high - self.mean) / self.stdev
        inside = self.mean * (_cdf(b) - _cdf(a)) + self.stdev * (_pdf(a) - _pdf(b))
        below = self.low * _cdf(a) if math.isfinite(self.low) else 0.0
        above = self.high * (1 - _cdf(b)) if math.isfinite(self.high) else 0.0
        return below + inside + above


NO_THINK = Clamped(0.0)


def output_length(mean: int, stdev: float, rng: random.Random) -> int:
    """One request's output length: ``mean`` itself without a spread, else a rounded normal, at least 1."""
    if stdev <= 0:
        return mean
    return max(1, round(rng.gauss(mean, stdev)))
