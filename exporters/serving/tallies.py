"""Plain-number tallies of prometheus_client children, folded into them before every collect.

The request path counts in plain numbers, written only by the event loop's thread without a lock or a call
of prometheus_client (:class:`CountTally`, :class:`HistogramTally`, :class:`SummaryTally`); the series'
parents (:class:`FoldingCounter`, :class:`FoldingHistogram`, :class:`FoldingGauge`, :class:`FoldingSummary`)
run ``before_collect`` first, which folds what the tallies counted since the last fold into the children
(``metrics.Tallies``). The numbers a fold adds are integers (counts) and a sum is added by the request path
itself, as observe adds it: the exposition is the one ``inc``, ``dec`` and ``observe`` leave, byte for byte
(tests/serving/test_request_tallies.py). A fold from another thread reads each number once and adds what it
has not added yet, so nothing is lost; numbers only grow (a gauge's net value is pushed as a difference).

These reach into prometheus_client's private attributes (a histogram's ``_upper_bounds``, ``_buckets`` and
``_sum``, a summary's ``_count`` and ``_sum``); the tests above pin the exposition, so a prometheus_client
release that changes them fails there, not silently in production.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable

from prometheus_client import Counter, Gauge, Histogram, Summary
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar


class FoldingCounter(Counter):
    """A Counter whose ``collect`` first runs ``before_collect`` (set on the parent): the per-token tallies of
    requests in flight are folded into its children before anything reads them. Children are of this class
    too (prometheus_client makes them with ``self.__class__``) and leave ``before_collect`` unset."""

    before_collect: Callable[[], None] | None = None

    def collect(self) -> Iterable[Metric]:
        if self.before_collect is not None:
            self.before_collect()
        return super().collect()


class FoldingHistogram(Histogram):
    """:class:`FoldingCounter`'s ``before_collect`` for a Histogram."""

    before_collect: Callable[[], None] | None = None

    def collect(self) -> Iterable[Metric]:
        if self.before_collect is not None:
            self.before_collect()
        return super().collect()


class FoldingGauge(Gauge):
    """:class:`FoldingCounter`'s ``before_collect`` for a Gauge."""

    before_collect: Callable[[], None] | None = None

    def collect(self) -> Iterable[Metric]:
        if self.before_collect is not None:
            self.before_collect()
        return super().collect()


class FoldingSummary(Summary):
    """:class:`FoldingCounter`'s ``before_collect`` for a Summary."""

    before_collect: Callable[[], None] | None = None

    def collect(self) -> Iterable[Metric]:
        if self.before_collect is not None:
            self.before_collect()
        return super().collect()


class SummaryTally:
    """A summary's child whose ``observe`` adds to the child's sum at once, as ``Summary.observe`` does (the
    same additions in the same order), and counts the observation as a plain number until ``metrics.Tallies``
    folds it into the child's count (integers: exact). Written only by the event loop's thread."""

    __slots__ = ("_count", "_folded", "_sum", "count")

    def __init__(self, child: Summary) -> None:
        self._count = child._count
        self._sum = child._sum
        self.count = 0
        self._folded = 0

    def observe(self, amount: float) -> None:
        self.count += 1
        self._sum.inc(amount)

    def fold(self) -> None:
        count = self.count
        if count != self._folded:
            self._count.inc(count - self._folded)
            self._folded = count


class CountTally:
    """A counter's or gauge's child, its ``inc``/``dec`` kept as a plain number until ``metrics.Tallies`` folds
    the difference into the child (one ``inc``, before every collect). Written only by the event loop's
    thread, without a lock; a fold from another thread reads the number once and adds what it has not added
    (integers, exact in a float: the child's value is the one the calls would have left)."""

    __slots__ = ("_child", "_folded", "value")

    def __init__(self, child: Counter | Gauge) -> None:
        self._child = child
        self.value: float = 0
        self._folded: float = 0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        """For a gauge's child only."""
        self.value -= amount

    def fold(self) -> None:
        value = self.value
        if value != self._folded:
            self._child.inc(value - self._folded)
            self._folded = value


class HistogramTally:
    """A histogram's child whose ``observe`` adds to the child's sum at once, as ``Histogram.observe`` does (the
    same additions, in the same order: the same sum), and counts the bucket (found by bisection, as observe's
    scan finds it for a finite amount) and keeps its exemplar (made as observe makes it, with the time of the
    observation) as plain numbers, until ``metrics.Tallies`` folds them into the child's buckets before every
    collect. Written only by the event loop's thread; counts only grow, so a fold in another thread misses
    nothing. The exemplars are always valid (a trace id: 32 characters); observe would check them."""

    __slots__ = ("_bounds", "_buckets", "_folded", "_set", "_sum", "counts", "exemplars")

    def __init__(self, child: Histogram) -> None:
        self._bounds: tuple[float, ...] = tuple(child._upper_bounds)
        self._buckets = child._buckets
        self._sum = child._sum
        n = len(self._bounds)
        self.counts = [0] * n
        self._folded = [0] * n
        self.exemplars: list[Exemplar | None] = [None] * n
        self._set: list[Exemplar | None] = [None] * n

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """``Histogram.observe(amount, exemplar)`` for a finite amount."""
        self._sum.inc(amount)
        i = bisect_left(self._bounds, amount)
        self.counts[i] += 1
        if exemplar:
            self.exemplars[i] = Exemplar(exemplar, amount, time.time())

    def fold(self) -> None:
        folded, kept, buckets = self._folded, self._set, self._buckets
        for i, count in enumerate(self.counts):
            if count != folded[i]:
                buckets[i].inc(count - folded[i])
                folded[i] = count
            exemplar = self.exemplars[i]
            if exemplar is not kept[i]:
                buckets[i].set_exemplar(exemplar)
                kept[i] = exemplar
