"""The exporter's collector: the sampling pass over the sub-collectors, and the scrape that serves it.

:meth:`GpuExporterCollector.sample` is the sampler's job (every ``--collect-interval``): every NVML read
happens there, each sub-collector on a thread of its own. A scrape (:meth:`GpuExporterCollector.collect`,
:meth:`GpuExporterCollector.exposition`) serves the latest pass, already encoded, plus a few live series,
among them each reading's age; it makes no NVML call and takes no session lock::

    collectors = [MemoryCollector(session), PowerCollector(session)]
    exporter = GpuExporterCollector(session, collectors, registry=registry)
    exporter.sample()            # the NVML reads
    generate_latest(registry)    # serves that pass
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from exporters.gpu.collector import PREFIX, CollectorRun, GpuCollector, counter, gauge, health_families, merge_families
from exporters.gpu.exposition import text_exposition
from exporters.gpu.session import Session
from loadlens.contracts.buckets import COLLECTOR_DURATION_SECONDS

__all__ = ["GpuExporterCollector", "HealthReading", "SamplerHealth", "Snapshot"]


def _le(bound: float) -> str:
    """Bucket bound as Prometheus writes it (``+Inf``, ``0.005``, ``1.0``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


PASS_WAIT_S = 2.0
"""How long a pass waits for one under way (and an untimed pass for the runs a timed one left going) before it
goes on without them: long enough for any pass that is not held up by a hanging read."""


class SamplerHealth(Protocol):
    """What :class:`GpuExporterCollector` needs from the sampler (a protocol to avoid an import cycle)."""

    ticks_total: int
    errors_total: int
    cpu_seconds_total: float
    last_tick_at: float | None
    interval: float
    window: float
    collect_every: float


@dataclass(frozen=True)
class HealthReading:
    """The session's health as of the end of a sampling pass (the scrape never takes the session lock)."""

    up: bool
    devices: int
    init_failures_total: int
    reinits_total: int
    errors: list[tuple[tuple[str, str], int]]

    @classmethod
    def of(cls, session: Session) -> HealthReading:
        with session.lock:
            return cls(
                session.up,
                len(session.all_devices()),
                session.init_failures_total,
                session.reinits_total,
                sorted(session.errors_total.items()),
            )


@dataclass(frozen=True)
class Snapshot:
    """One sampling pass: every collector's run with the monotonic time its reads began (``taken_at``), the
    families a scrape serves (collectors' families, their health and the session's, already merged), and
    those families in text format 0.0.4, encoded once per pass so that a scrape only copies bytes."""

    runs: list[tuple[CollectorRun, float]]
    families: list[Metric]
    text: bytes


class GpuExporterCollector(Collector):
    """Serves the latest sampling pass of the enabled sub-collectors, with exporter health and sample ages.

    The sampler calls :meth:`sample` on its schedule (every ``--collect-interval``); that pass makes every
    NVML call. A scrape (:meth:`collect`, :meth:`exposition`) makes none: it serves the last pass's
    families and adds the few live series (sampler counters, sample ages, the scrape histogram). The only
    collector the exporter registers. ``collect_on_scrape=True`` runs a pass inside every scrape instead:
    the behaviour before issue 24, kept so that the benchmark can compare both paths on the same code.
    """

    def __init__(
        self,
        session: Session,
        collectors: Sequence[GpuCollector],
        *,
        sampler: SamplerHealth | None = None,
        registry: CollectorRegistry | None = None,
        timer: Callable[[], float] = time.perf_counter,
        monotonic: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
        collect_on_scrape: bool = False,
    ) -> None:
        self._session = session
        self._collectors = list(collectors)
        self._sampler = sampler
        self._timer = timer
        self._monotonic = monotonic
        self._cpu_clock = cpu_clock
        self.collect_on_scrape = collect_on_scrape
        self.cpu_seconds_total = 0.0  # the collectors' runs on their threads (the sampler counts its own)
        self._state_lock = threading.Lock()
        self._latest: dict[str, tuple[CollectorRun, float]] = {}  # collector -> latest finished run, taken_at
        self._in_flight: set[str] = set()
        self._publish_lock = threading.Lock()
        self._running: dict[str, threading.Thread] = {}
        self._pass_lock = threading.Lock()
        self._bucket_bounds = COLLECTOR_DURATION_SECONDS
        self._bucket_counts = [0] * (len(COLLECTOR_DURATION_SECONDS) + 1)
        self._scrape_sum = 0.0
        # Before the first pass: nothing read yet, so no collector series and NVML not (yet) up.
        empty = list(self._session_families(HealthReading(False, 0, 0, 0, [])))
        self._snapshot = Snapshot([], empty, text_exposition(empty))
        if registry:
            registry.register(self)

    @property
    def collectors(self) -> list[GpuCollector]:
        return list(self._collectors)

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def describe(self) -> list[Metric]:
        return []

    # --- the sampling pass (sampler thread) ---

    def sample(self, timeout: float | None = None) -> None:
        """One sampling pass: every NVML read happens here. Never raises.

        Each collector not still busy with an earlier pass runs on a thread of its own, so a call that hangs
        holds up only its collector. Waits for them (at most ``timeout`` seconds; None: until they are done),
        then publishes the latest finished run of every collector: a collector still running keeps its
        previous reading, and its age grows. ``collect_on_scrape`` runs them inline instead (the old path).
        """
        # A pass asked for after a change (sample_now after a probe write) must not publish what a pass already
        # under way read before it: wait for that pass, and for runs an earlier timed pass left going, but only so
        # long (PASS_WAIT_S): a pass held up by a hanging read must not hold up the next one.
        serial = self._pass_lock.acquire(timeout=PASS_WAIT_S)
        try:
            self._pass(timeout, wait_earlier=serial and timeout is None)
        finally:
            if serial:
                self._pass_lock.release()

    def _pass(self, timeout: float | None, *, wait_earlier: bool) -> None:
        if self.collect_on_scrape:
            for c in self._collectors:
                self._work(c, count_cpu=False)
        else:
            if wait_earlier:
                with self._state_lock:
                    earlier = list(self._running.values())
                until = time.monotonic() + PASS_WAIT_S
                for t in earlier:
                    t.join(max(0.0, until - time.monotonic()))
            threads = []
            with self._state_lock:
                for c in self._collectors:
                    if c.name in self._in_flight:
                        continue  # its earlier run has not returned (an NVML call that hangs)
                    self._in_flight.add(c.name)
                    t = threading.Thread(target=self._work, args=(c,), name=f"gpu-{c.name}", daemon=True)
                    self._running[c.name] = t
                    threads.append(t)
            for t in threads:
                t.start()
            end = None if timeout is None else time.monotonic() + timeout
            for t in threads:
                t.join(None if end is None else max(0.0, end - time.monotonic()))
        self._publish()

    def _work(self, collector: GpuCollector, *, count_cpu: bool = True) -> None:
        try:
            cpu0, taken_at = self._cpu_clock(), self._monotonic()
            run = collector.run()
            cpu = self._cpu_clock() - cpu0
            with self._state_lock:
                self._latest[collector.name] = (run, taken_at)
                if count_cpu:
                    self.cpu_seconds_total += max(0.0, cpu)
        finally:
            with self._state_lock:
                self._in_flight.discard(collector.name)
                self._running.pop(collector.name, None)

    def _publish(self) -> None:
        with self._publish_lock:
            with self._state_lock:
                runs = [self._latest[c.name] for c in self._collectors if c.name in self._latest]
            families = merge_families([f for run, _ in runs for f in run.families])
            families.extend(health_families([run for run, _ in runs], self._session))
            families.extend(self._session_families(HealthReading.of(self._session)))
            self._snapshot = Snapshot(runs, families, text_exposition(families))  # one reference swap

    # --- the scrape (no NVML, no session lock) ---

    def _current(self) -> Snapshot:
        if self.collect_on_scrape:
            self.sample()
        return self._snapshot

    def _observe(self, seconds: float) -> None:
        i = next((i for i, b in enumerate(self._bucket_bounds) if seconds <= b), len(self._bucket_bounds))
        self._bucket_counts[i] += 1
        self._scrape_sum += seconds

    def collect(self) -> Iterator[Metric]:
        start = self._timer()
        snap = self._current()
        yield from snap.families
        yield from self._live_families(snap)
        self._observe(self._timer() - start)
        yield self._scrape_histogram()

    def exposition(self) -> bytes:
        """What :meth:`collect` yields, in text format 0.0.4: the pass's bytes plus the live families."""
        start = self._timer()
        snap = self._current()
        live = text_exposition(self._live_families(snap))
        self._observe(self._timer() - start)
        return b"".join((snap.text, live, text_exposition([self._scrape_histogram()])))

    def _session_families(self, h: HealthReading) -> Iterator[Metric]:
        up = gauge("nvml_up", "1 if NVML is initialised and sees at least one GPU, else 0.", [])
        up.add_metric([], 1.0 if h.up else 0.0)
        yield up
        devices = gauge("devices", "GPUs NVML enumerates, lost ones included.", [])
        devices.add_metric([], float(h.devices))
        yield devices
        init_failures = counter("nvml_init_failures", "nvmlInit calls that failed.", [])
        init_failures.add_metric([], float(h.init_failures_total))
        yield init_failures
        reinits = counter("nvml_reinits", "NVML re-initialisations after a lifecycle error or lost GPU.", [])
        reinits.add_metric([], float(h.reinits_total))
        yield reinits
        errors = counter(
            "nvml_errors",
            "NVML call failures by collector and NVML error name (NotSupported is not counted).",
            ["collector", "error"],
        )
        for (collector, error), n in h.errors:
            errors.add_metric([collector, error], float(n))
        yield errors

    def _live_families(self, snap: Snapshot) -> Iterator[Metric]:
        now = self._monotonic()
        sampler = self._sampler
        if sampler is not None:
            ticks = counter("sampler_ticks", "Sampler polls of the driver's sample buffers.", [])
            ticks.add_metric([], float(sampler.ticks_total))
            yield ticks
            tick_errors = counter("sampler_errors", "Sampler polls that hit an NVML error.", [])
            tick_errors.add_metric([], float(sampler.errors_total))
            yield tick_errors
            interval = gauge("sampler_interval_seconds", "Configured sampler poll interval.", [])
            interval.add_metric([], sampler.interval)
            yield interval
            window = gauge("window_seconds", "Configured length of the rolling window for window statistics.", [])
            window.add_metric([], sampler.window)
            yield window
            every = gauge(
                "collect_interval_seconds", "Configured interval between the sampler's passes over the collectors.", []
            )
            every.add_metric([], sampler.collect_every)
            yield every
            cpu = counter("sampler_cpu_seconds", "CPU time the sampler spent in its polls and collector passes.", [])
            cpu.add_metric([], sampler.cpu_seconds_total + self.cpu_seconds_total)
            yield cpu
        age = gauge(
            "sample_age_seconds",
            "Seconds since the reading this scrape serves began: per collector (its last sampling pass) and "
            'collector="sampler" (its last poll of the sample buffers and memory).',
            ["collector"],
        )
        for run, taken_at in snap.runs:
            age.add_metric([run.name], max(0.0, now - taken_at))
        if sampler is not None and sampler.last_tick_at is not None:
            age.add_metric(["sampler"], max(0.0, now - sampler.last_tick_at))
        yield age

    def _scrape_histogram(self) -> HistogramMetricFamily:
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, n in zip((*self._bucket_bounds, float("inf")), self._bucket_counts, strict=True):
            cumulative += n
            buckets.append((_le(bound), float(cumulative)))
        h = HistogramMetricFamily(
            f"{PREFIX}_scrape_duration_seconds",
            "Time to collect every enabled collector, per scrape (this one included).",
        )
        h.add_metric([], buckets, self._scrape_sum)
        return h
