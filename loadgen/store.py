"""Where measurements go: full-precision distributions and counters by (stage, priority class, model).

Every distribution is a :class:`~loadgen.dist.Dist` (``loadgen/dist.py``): an HdrHistogram for quantiles, exact
moments, and exact counts per Prometheus bucket.

In distributed mode each worker ships its store to the master as a delta every report interval
(:meth:`Store.take_delta`) and the master adds it (:meth:`Store.merge`): histograms add exactly, so the merged
quantiles are those of all samples, not an average of per-worker quantiles.

Usage::

    store = Store(bounds={"ttft": (0.1, 0.2, ...), ...})
    store.record(record, key=("c8", "interactive", "tiny"), cls=slos.class_for_priority(0))
    store.series[("c8", "interactive", "tiny")].dists["ttft"].quantile(0.99)
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from loadgen.dist import Dist
from loadgen.record import OUTCOMES, SLO_NAMES, SUCCESS, RequestRecord, breaches
from loadgen.workload import WorkloadStats
from loadlens.contracts.slo import PriorityClass

METRICS: tuple[str, ...] = ("ttft", "itl", "chunk_itl", "tpot", "e2el", "dispatch_lag")
"""Distribution names; ``e2el`` and ``itl`` follow ``vllm bench serve``'s result keys."""

MAX_REASONS = 20
"""Distinct failure reasons kept per series; the rest are counted under ``other``."""

Key = tuple[str, str, str]
"""(stage, priority_class, model_name)"""


class Series:
    """Everything measured for one (stage, priority_class, model_name)."""

    __slots__ = (
        "dists",
        "outcomes",
        "input_tokens",
        "output_tokens",
        "goodput",
        "slo_breaches",
        "itl_fallback",
        "reasons",
        "bounds",
    )

    def __init__(self, bounds: Mapping[str, tuple[float, ...]]) -> None:
        self.bounds = bounds
        self.dists = {m: Dist(bounds[m]) for m in METRICS}
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.input_tokens = 0
        self.output_tokens = 0
        self.goodput = 0
        self.slo_breaches: dict[str, int] = dict.fromkeys(SLO_NAMES, 0)
        self.itl_fallback = 0
        self.reasons: Counter[str] = Counter()

    def add(self, record: RequestRecord, cls: PriorityClass) -> list[str]:
        """Count one finished request; returns the SLOs it missed (empty for failures, which are not judged)."""
        self.outcomes[record.outcome] = self.outcomes.get(record.outcome, 0) + 1
        if record.dispatch_lag is not None:
            self.dists["dispatch_lag"].record(record.dispatch_lag)
        if record.outcome != SUCCESS:
            if record.outcome != "cancelled":
                reason = record.reason or record.outcome
                if reason not in self.reasons and len(self.reasons) >= MAX_REASONS:
                    reason = "other"
                self.reasons[reason] += 1
            return []
        d = self.dists
        if record.ttft is not None:
            d["ttft"].record(record.ttft)
        if record.e2e is not None:
            d["e2el"].record(record.e2e)
        tpot = record.tpot
        if tpot is not None:
            d["tpot"].record(tpot)
        itl = d["itl"]
        for gap, n in record.itl_samples():
            itl.record(gap, n)
        chunk = d["chunk_itl"]
        for gap in record.chunk_gaps:
            chunk.record(gap)
        if record.itl_source != "usage":
            self.itl_fallback += 1
        self.input_tokens += record.prompt_tokens
        self.output_tokens += record.output_tokens
        missed = breaches(record, cls)
        for slo in missed:
            self.slo_breaches[slo] += 1
        if not missed:
            self.goodput += 1
        return missed

    def merge(self, other: Series) -> None:
        for m, dist in other.dists.items():
            self.dists[m].merge(dist)
        for k, v in other.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.goodput += other.goodput
        for k, v in other.slo_breaches.items():
            self.slo_breaches[k] = self.slo_breaches.get(k, 0) + v
        self.itl_fallback += other.itl_fallback
        for reason, n in other.reasons.items():
            if reason not in self.reasons and len(self.reasons) >= MAX_REASONS:
                reason = "other"
            self.reasons[reason] += n

    @property
    def completed(self) -> int:
        return self.outcomes.get(SUCCESS, 0)

    @property
    def failed(self) -> int:
        return sum(v for k, v in self.outcomes.items() if k not in (SUCCESS, "cancelled"))

    def to_wire(self) -> dict[str, Any]:
        return {
            "dists": {m: d.to_wire() for m, d in self.dists.items() if d.count},
            "outcomes": {k: v for k, v in self.outcomes.items() if v},
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "goodput": self.goodput,
            "slo_breaches": self.slo_breaches,
            "itl_fallback": self.itl_fallback,
            "reasons": dict(self.reasons),
        }

    @classmethod
    def from_wire(cls, bounds: Mapping[str, tuple[float, ...]], doc: Mapping[str, Any]) -> Series:
        s = cls(bounds)
        for m, d in doc.get("dists", {}).items():
            if m in s.dists:
                s.dists[m] = Dist.from_wire(bounds[m], d)
        for k, v in doc.get("outcomes", {}).items():
            s.outcomes[k] = s.outcomes.get(k, 0) + int(v)
        s.input_tokens = int(doc.get("input_tokens", 0))
        s.output_tokens = int(doc.get("output_tokens", 0))
        s.goodput = int(doc.get("goodput", 0))
        for k, v in doc.get("slo_breaches", {}).items():
            s.slo_breaches[k] = int(v)
        s.itl_fallback = int(doc.get("itl_fallback", 0))
        s.reasons.update({str(k): int(v) for k, v in doc.get("reasons", {}).items()})
        return s


Bins = dict[int, list[float]]
"""Wall-clock second -> [sum, count]: a per-second mean that adds exactly across processes."""


class Timeline:
    """A stage's per-second series for the over-saturation test (``loadgen/saturation.py``).

    ``ttft``: TTFT of the stage's successful requests by the wall second their first token arrived;
    ``queue``: samples of the requests each process held (in flight plus due, unsent open-loop arrivals), at
    most one per process and second, so ``sum`` over processes is the whole load generator's.
    """

    __slots__ = ("ttft", "queue")

    def __init__(self) -> None:
        self.ttft: Bins = {}
        self.queue: Bins = {}

    @staticmethod
    def add(bins: Bins, second: int, value: float, n: int = 1) -> None:
        cell = bins.get(second)
        if cell is None:
            bins[second] = [value, float(n)]
        else:
            cell[0] += value
            cell[1] += n

    def merge(self, other: Timeline) -> None:
        for mine, theirs in ((self.ttft, other.ttft), (self.queue, other.queue)):
            for second, (total, count) in theirs.items():
                self.add(mine, second, total, int(count))

    def to_wire(self) -> dict[str, Any]:
        return {
            "ttft": {str(k): v for k, v in self.ttft.items()},
            "queue": {str(k): v for k, v in self.queue.items()},
        }

    @classmethod
    def from_wire(cls, doc: Mapping[str, Any]) -> Timeline:
        t = cls()
        t.ttft = {int(k): [float(v[0]), float(v[1])] for k, v in doc.get("ttft", {}).items()}
        t.queue = {int(k): [float(v[0]), float(v[1])] for k, v in doc.get("queue", {}).items()}
        return t


class Store:
    """All series of a run, plus per-stage token arrivals (``window_tokens``) and tokens per wall second."""

    def __init__(self, bounds: Mapping[str, tuple[float, ...]]) -> None:
        missing = set(METRICS) - set(bounds)
        if missing:
            raise ValueError(f"bucket bounds missing for {sorted(missing)}")
        self.bounds = dict(bounds)
        self.series: dict[Key, Series] = {}
        self.window_tokens: Counter[str] = Counter()
        """Output tokens that *arrived* while each stage was current (whatever stage their request began in)."""
        self.tokens_by_second: Counter[int] = Counter()
        """Output tokens by arrival wall-clock second (``int(time.time())``), for max_output_tokens_per_s."""
        self.cpu_seconds: defaultdict[str, float] = defaultdict(float)
        self.loop_lag: dict[str, Dist] = {}
        """How late the load generator's event loop woke from 5 ms sleeps, per stage window: every timestamp the
        client takes can be late by as much, so its p99 bounds the client's own measurement error."""
        """CPU time the load-generator processes spent while each stage was current (summed over processes)."""
        self.workload = WorkloadStats(self.bounds["ttft"])
        """Conversations, per-turn figures and the expected prefix-cache hits, per stage (loadgen/workload.py)."""
        self.timelines: dict[str, Timeline] = {}
        """Per stage (the stage a request began in): the over-saturation test's series."""

    def timeline(self, stage: str) -> Timeline:
        t = self.timelines.get(stage)
        if t is None:
            t = self.timelines[stage] = Timeline()
        return t

    def queue_sample(self, stage: str, second: int, outstanding: int) -> None:
        """One process's count of the requests it holds during ``stage``, at wall second ``second``."""
        Timeline.add(self.timeline(stage).queue, second, float(outstanding))

    def lag(self, window: str) -> Dist:
        dist = self.loop_lag.get(window)
        if dist is None:
            dist = self.loop_lag[window] = Dist(self.bounds["dispatch_lag"])
        return dist

    def get(self, key: Key) -> Series:
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = Series(self.bounds)
        return series

    def seed(self, keys: Iterable[Key]) -> None:
        """Create empty series so that every expected label set is exported as zero from the start."""
        for key in keys:
            self.get(key)

    def record(self, record: RequestRecord, key: Key, cls: PriorityClass, now: float | None = None) -> list[str]:
        """Count a finished request; ``now`` (wall clock, default: now) dates its first token for the timeline."""
        if record.ok and record.ttft is not None and record.e2e is not None:
            first_token = (time.time() if now is None else now) - record.e2e + record.ttft
            Timeline.add(self.timeline(key[0]).ttft, int(first_token), record.ttft)
        return self.get(key).add(record, cls)

    def completed(self, stage: str | None = None) -> int:
        return sum(s.completed for k, s in self.series.items() if stage is None or k[0] == stage)

    def finished(self, stage: str | None = None) -> int:
        """Requests that ended in any way except being cancelled by the load generator."""
        return sum(s.completed + s.failed for k, s in self.series.items() if stage is None or k[0] == stage)

    def merged(self, keys: Iterable[Key]) -> Series:
        out = Series(self.bounds)
        for key in keys:
            if key in self.series:
                out.merge(self.series[key])
        return out

    def merge(self, other: Store) -> None:
        for key, series in other.series.items():
            self.get(key).merge(series)
        self.window_tokens.update(other.window_tokens)
        self.tokens_by_second.update(other.tokens_by_second)
        for stage, seconds in other.cpu_seconds.items():
            self.cpu_seconds[stage] += seconds
        for stage, dist in other.loop_lag.items():
            self.lag(stage).merge(dist)
        self.workload.merge(other.workload)
        for stage, timeline in other.timelines.items():
            self.timeline(stage).merge(timeline)

    def to_wire(self) -> dict[str, Any]:
        return {
            "series": [[list(k), s.to_wire()] for k, s in self.series.items()],
            "window_tokens": dict(self.window_tokens),
            "tokens_by_second": {str(k): v for k, v in self.tokens_by_second.items()},
            "cpu_seconds": dict(self.cpu_seconds),
            "loop_lag": {k: d.to_wire() for k, d in self.loop_lag.items() if d.count},
            "workload": self.workload.to_wire(),
            "timelines": {k: t.to_wire() for k, t in self.timelines.items()},
        }

    @classmethod
    def from_wire(cls, bounds: Mapping[str, tuple[float, ...]], doc: Mapping[str, Any]) -> Store:
        store = cls(bounds)
        for raw_key, sdoc in doc.get("series", []):
            key = (str(raw_key[0]), str(raw_key[1]), str(raw_key[2]))
            store.series[key] = Series.from_wire(store.bounds, sdoc)
        store.window_tokens.update({str(k): int(v) for k, v in doc.get("window_tokens", {}).items()})
        store.tokens_by_second.update({int(k): int(v) for k, v in doc.get("tokens_by_second", {}).items()})
        for k, v in doc.get("cpu_seconds", {}).items():
            store.cpu_seconds[str(k)] += float(v)
        for k, d in doc.get("loop_lag", {}).items():
            store.loop_lag[str(k)] = Dist.from_wire(store.bounds["dispatch_lag"], d)
        store.workload = WorkloadStats.from_wire(store.bounds["ttft"], doc.get("workload", {}))
        for k, tl in doc.get("timelines", {}).items():
            store.timelines[str(k)] = Timeline.from_wire(tl)
        return store

    def take_delta(self) -> dict[str, Any]:
        """Everything recorded since the last call, as a wire document; the store starts empty again."""
        doc = self.to_wire()
        self.series = {}
        self.window_tokens = Counter()
        self.tokens_by_second = Counter()
        self.cpu_seconds = defaultdict(float)
        self.loop_lag = {}
        self.workload = WorkloadStats(self.bounds["ttft"])
        self.timelines = {}
        return doc
