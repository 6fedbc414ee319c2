"""Collector plumbing: the sub-collector base class, per-call error handling, and the exporter collector.

Each concern is one :class:`GpuCollector` subclass in ``exporters/gpu/collectors/``. It yields fresh
metric families every run and keeps no state between runs (except ``gpm``: a GPM metric needs the previous
pass's sample). Standalone (registered on its own), it runs at
each collection and also yields its own ``loadlens_gpu_collector_success`` and ``..._duration_seconds``.
Inside the exporter, :class:`exporters.gpu.exporter_collector.GpuExporterCollector` runs every enabled
sub-collector in the sampler's pass (every NVML read happens there) and a scrape serves the latest pass. It
reports all of their health in one family each (as node_exporter does), so the exposition never repeats a
family.

Error policy, per NVML call (:meth:`Scrape.read`): NotSupported and friends -> the series is absent (debug
log); GPU lost -> that GPU is marked down and skipped, the others carry on; NVML down -> the rest of the
scrape is skipped and NVML re-initialises later; anything else -> logged, the collector reports failure,
other GPUs and fields carry on. An exception escaping a collector fails that collector only.
"""

from __future__ import annotations

import abc
import copy
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from exporters.gpu.families import RowCounter, RowGauge
from exporters.gpu.nvml import ErrorKind, NvmlError
from exporters.gpu.session import DEVICE_LABELS, Device, Session

log = logging.getLogger(__name__)

PREFIX = "loadlens_gpu"
T = TypeVar("T")

__all__ = [
    "DEVICE_LABELS",
    "PREFIX",
    "CollectorRun",
    "GpuCollector",
    "Scrape",
    "counter",
    "gauge",
    "health_families",
    "merge_families",
]


def gauge(name: str, documentation: str, labels: Sequence[str] = DEVICE_LABELS, unit: str = "") -> RowGauge:
    return RowGauge(f"{PREFIX}_{name}", documentation, labels, unit=unit)


def counter(name: str, documentation: str, labels: Sequence[str] = DEVICE_LABELS) -> RowCounter:
    return RowCounter(f"{PREFIX}_{name}", documentation, labels)


class Scrape:
    """One collector's pass over the GPUs: the device list and a guarded NVML call helper."""

    def __init__(self, session: Session, collector: str) -> None:
        self.session = session
        self.collector = collector
        self.ok = True
        self._down = False
        self._skip: set[int] = set()

    def devices(self) -> list[Device]:
        """GPUs that are up. None at all (NVML down or zero GPUs) fails the collector."""
        devices = self.session.devices()
        if not devices:
            self.ok = False
        return devices

    def read(self, device: Device | None, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``, or None when it failed (the failure is classified and recorded)."""
        if self._down or (device is not None and device.index in self._skip):
            return None
        try:
            return fn(*args)
        except NvmlError as err:
            self.fail(device, err)
            return None

    def skipped(self, device: Device) -> bool:
        return self._down or device.index in self._skip

    def fail(self, device: Device | None, err: NvmlError) -> None:
        where = f"GPU {device.index}" if device is not None else "system"
        if err.kind in (ErrorKind.UNSUPPORTED, ErrorKind.NO_DATA):
            log.debug("%s: %s: %s (series omitted)", self.collector, where, err)
            return
        self.session.record_error(self.collector, err)
        if err.kind is ErrorKind.DEVICE_LOST and device is not None:
            # The GPU is reported by device_up; the collector still did its job for the others.
            self._skip.add(device.index)
            self.session.mark_lost(device, err)
            return
        self.ok = False
        if err.kind is ErrorKind.LIFECYCLE:
            self._down = True
            self.session.mark_down(err)
            return
        log.error("%s: %s: %s", self.collector, where, err)


@dataclass(frozen=True)
class CollectorRun:
    name: str
    success: bool
    duration: float
    families: list[Metric]


class GpuCollector(abc.ABC):
    """Base for one concern. Subclasses set ``name`` and implement :meth:`_collect`."""

    name: ClassVar[str]

    def __init__(
        self,
        session: Session,
        *,
        registry: CollectorRegistry | None = None,
        timer: Callable[[], float] = time.perf_counter,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._session = session
        self._timer = timer
        self._clock = clock
        if registry:
            registry.register(self)

    @property
    def session(self) -> Session:
        return self._session

    @abc.abstractmethod
    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        """Yield this scrape's families; use ``scrape.read`` for every NVML call."""

    def describe(self) -> list[Metric]:
        # Registering must not trigger a collection (NVML may be slow or down at start-up).
        return []

    def run(self) -> CollectorRun:
        """Collect once; never raises."""
        start = self._timer()
        scrape = Scrape(self._session, self.name)
        self._session.ensure()  # a re-initialisation, if due, before this run's calls (never during them)
        with self._session.calls():
            try:
                families = list(self._collect(scrape))
            except Exception:
                log.exception("collector %s failed", self.name)
                scrape.ok = False
                families = []
        duration = self._timer() - start
        if scrape.ok:
            self._session.record_success(self.name, self._clock())
        return CollectorRun(self.name, scrape.ok, duration, families)

    def collect(self) -> Iterator[Metric]:
        run = self.run()
        yield from run.families
        yield from health_families([run], self._session)


def health_families(runs: Sequence[CollectorRun], session: Session) -> Iterator[Metric]:
    success = gauge("collector_success", "1 if the collector's last run succeeded, else 0.", ["collector"])
    duration = gauge("collector_duration_seconds", "Duration of the collector's last run.", ["collector"])
    last = gauge(
        "collector_last_success_timestamp_seconds",
        "Unix time of the collector's last successful run.",
        ["collector"],
    )
    for run in runs:
        success.add_metric([run.name], 1.0 if run.success else 0.0)
        duration.add_metric([run.name], run.duration)
        ts = session.last_success.get(run.name)
        if ts is not None:
            last.add_metric([run.name], ts)
    yield success
    yield duration
    yield last


def merge_families(families: list[Metric]) -> list[Metric]:
    """One family per name: the sim ``allocator`` and ``probe`` collectors both emit ``allocator_*`` (with
    different label sets), and a name repeated in an exposition makes Prometheus reject the scrape."""
    if len({f.name for f in families}) == len(families):
        return families  # the common case: nothing to do
    out: dict[str, Metric] = {}
    for fam in families:
        first = out.get(fam.name)
        if first is None:
            out[fam.name] = fam
        elif (
            isinstance(first, RowGauge | RowCounter)
            and isinstance(fam, RowGauge | RowCounter)
            and first.type == fam.type
            and first.label_names == fam.label_names
        ):
            # A copy: the families of a run are published again while its collector is busy (never mutated).
            merged_rows = copy.copy(first)
            merged_rows.rows = [*first.rows, *fam.rows]
            out[fam.name] = merged_rows
        else:
            merged = Metric(first.name, first.documentation, first.type)
            merged.samples = [*first.samples, *fam.samples]
            out[fam.name] = merged
    return list(out.values())
