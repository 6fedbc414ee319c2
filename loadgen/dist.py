"""A latency distribution with three views of the same samples (``Dist``), merged exactly across processes.

- an HdrHistogram in microseconds (3 significant digits: quantiles within 0.05 %) for the results file;
- exact count, sum, sum of squares, min and max (exact mean and standard deviation);
- counts per Prometheus bucket of ``bounds`` (exact: each sample is placed with ``bisect``), for /metrics.

The store (``loadgen/store.py``) keeps one per metric and series; the workload figures (``loadgen/workload.py``)
one per conversation turn. Both ship them to the master in the wire format of :meth:`Dist.to_wire`.

Usage::

    dist = Dist(bounds=(0.1, 0.2, 0.5))
    dist.record(0.12)
    dist.quantile(0.99), dist.cumulative()
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

from hdrh.histogram import HdrHistogram

HDR_LOWEST_US = 1
HDR_HIGHEST_US = 3600 * 1_000_000
"""One hour: longer samples are clamped (and counted in ``Dist.clamped``)."""
HDR_DIGITS = 3


class Dist:
    """One latency distribution in seconds. See the module docstring for its three views."""

    __slots__ = (
        "bounds",
        "buckets",
        "count",
        "sum",
        "sumsq",
        "min",
        "max",
        "clamped",
        "_hdr",
        "_pending",
        "_cum",
        "_cum_n",
    )

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)  # non-cumulative; last is (max bound, +Inf)
        self.count = 0
        self.sum = 0.0
        self.sumsq = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.clamped = 0
        self._hdr: HdrHistogram | None = None  # allocated on first use (about 190 KB)
        self._pending: dict[int, int] = {}  # microseconds -> count, not yet in the HDR (see record)
        self._cum: list[int] = []  # cumulative HDR counts, rebuilt when the count changed
        self._cum_n = -1

    @property
    def hdr(self) -> HdrHistogram:
        """The HdrHistogram with every sample recorded so far (pending samples are flushed into it first)."""
        if self._hdr is None:
            self._hdr = HdrHistogram(HDR_LOWEST_US, HDR_HIGHEST_US, HDR_DIGITS)
        if self._pending:
            record_value = self._hdr.record_value
            for us, n in self._pending.items():
                record_value(us, n)
            self._pending.clear()
        return self._hdr

    def record(self, seconds: float, n: int = 1) -> None:
        """Add ``n`` samples of ``seconds``. This runs once per streamed token, so the HDR update (several
        microseconds in hdrh's pure Python) is deferred: samples collect per microsecond in a dict and are
        added to the HDR in one call per distinct value when the histogram is read or shipped."""
        if seconds < 0:
            seconds = 0.0  # a clock can only make this happen by a few ns; never drop the sample
        us = round(seconds * 1e6)
        if us > HDR_HIGHEST_US:
            us = HDR_HIGHEST_US
            self.clamped += n
        pending = self._pending
        pending[us] = pending.get(us, 0) + n
        self.buckets[bisect_left(self.bounds, seconds)] += n
        self.count += n
        self.sum += seconds * n
        self.sumsq += seconds * seconds * n
        if seconds < self.min:
            self.min = seconds
        if seconds > self.max:
            self.max = seconds

    def merge(self, other: Dist) -> None:
        if other.count == 0:
            return
        if other.bounds != self.bounds:
            raise ValueError("cannot merge distributions with different bucket bounds")
        self.hdr.add(other.hdr)
        for i, c in enumerate(other.buckets):
            self.buckets[i] += c
        self.count += other.count
        self.sum += other.sum
        self.sumsq += other.sumsq
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.clamped += other.clamped

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    @property
    def std(self) -> float:
        if not self.count:
            return math.nan
        var = self.sumsq / self.count - self.mean**2
        return math.sqrt(var) if var > 0 else 0.0

    def quantile(self, q: float) -> float:
        """Seconds at quantile ``q`` (0-1): the midpoint of the HDR bucket, kept inside the exact [min, max]."""
        if not self.count:
            return math.nan
        hdr = self.hdr
        if self._cum_n != self.count:
            # hdrh's get_value_at_percentile walks the counts in Python (~7 ms); accumulate runs in C.
            self._cum = list(accumulate(hdr.counts))
            self._cum_n = self.count
        target = max(1, int(q * self.count + 0.5))  # the rank hdrh's get_value_at_percentile uses
        v = hdr.get_value_from_index(min(bisect_left(self._cum, target), len(self._cum) - 1))
        mid = (hdr.get_lowest_equivalent_value(v) + hdr.get_highest_equivalent_value(v)) / 2.0
        return float(min(self.max, max(self.min, mid / 1e6)))

    def cumulative(self) -> list[int]:
        """Prometheus ``_bucket`` values for ``bounds`` then +Inf."""
        out: list[int] = []
        running = 0
        for c in self.buckets:
            running += c
            out.append(running)
        return out

    def to_wire(self) -> dict[str, Any]:
        return {
            "hdr": self.hdr.encode().decode("ascii") if self.count else "",
            "buckets": self.buckets,
            "count": self.count,
            "sum": self.sum,
            "sumsq": self.sumsq,
            "min": self.min if self.count else None,
            "max": self.max if self.count else None,
            "clamped": self.clamped,
        }

    @classmethod
    def from_wire(cls, bounds: tuple[float, ...], doc: Mapping[str, Any]) -> Dist:
        dist = cls(bounds)
        if not doc.get("count"):
            return dist
        dist._hdr = HdrHistogram.decode(doc["hdr"].encode("ascii"))
        if len(doc["buckets"]) != len(dist.buckets):
            raise ValueError("bucket layout differs between load generator processes")
        dist.buckets = [int(c) for c in doc["buckets"]]
        dist.count = int(doc["count"])
        dist.sum = float(doc["sum"])
        dist.sumsq = float(doc["sumsq"])
        dist.min = float(doc["min"])
        dist.max = float(doc["max"])
        dist.clamped = int(doc.get("clamped", 0))
        return dist
