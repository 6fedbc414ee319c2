"""The background sampler: makes every NVML call, on its own schedule, so that a scrape makes none.

Each tick (default every 0.1 s) it asks ``nvmlDeviceGetSamples`` for the utilisation samples produced
since the last one it saw, so it keeps every sample at the driver's native rate (1/6 s to 1 s depending on
the product) whatever the scrape interval. It also reads used memory (for the fluctuation ratio and step
detection) and drains pending XID events without blocking. It recomputes the utilisation window statistics
at most every ``stats_every`` seconds (default 1 s) when new samples have arrived, so a scrape only reads
them, and a tick costs a few NVML calls per GPU. Every ``collect_every`` seconds (default 1 s) a tick also
runs the collectors' sampling pass (``GpuExporterCollector.sample`` in :mod:`exporters.gpu.exporter_collector`),
which reads everything else the scrape serves. ``cpu_seconds_total`` counts the CPU time of ticks and
passes (the calling thread's; the collectors' own threads are counted by the exporter collector)::

    sampler = Sampler(session, interval=0.1, window=30.0)
    sampler.start()
    sampler.util_stats(uuid)    # exporters.gpu.stats.UtilStats or None
    sampler.stop()

The utilisation window is anchored at the newest sample (``window`` seconds of driver samples); the memory
window at the sampler's monotonic clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporters.gpu.collector import Scrape
from exporters.gpu.nvml import ErrorKind, NvmlError
from exporters.gpu.session import Device, Session
from exporters.gpu.stats import MemoryWindow, StepDetector, UtilStats, memory_window, util_stats

log = logging.getLogger(__name__)

MAX_XID_CODES = 32  # distinct XID label values per GPU; later codes count under xid="other"
XID_OTHER = -1
_XID_DRAIN_PER_TICK = 64


@dataclass
class DeviceWindow:
    """Everything the sampler has seen of one GPU (keyed by UUID so it survives NVML re-initialisation)."""

    steps: StepDetector
    util: deque[tuple[int, float]] = field(default_factory=deque)  # (timestamp µs, ratio)
    memory: deque[tuple[float, int]] = field(default_factory=deque)  # (monotonic s, used bytes)
    last_ts_us: int = 0
    step_count: int = 0
    step_bytes: int = 0
    xid_registered: bool = False
    xid_total: int = 0
    xid_counts: dict[int, int] = field(default_factory=dict)
    xid_last_time: float | None = None
    version: int = 0  # bumped when samples arrive
    stats: UtilStats | None = None  # computed by the sampler, read by scrapes
    stats_version: int = -1
    stats_time: float = -float("inf")

    def refresh_stats(self, now: float, every: float) -> None:
        """Recompute the utilisation statistics if samples arrived and ``every`` seconds have passed."""
        if self.version == self.stats_version or now - self.stats_time < every:
            return
        # Relative times: absolute µs timestamps (~1.7e15) lose sub-µs precision as float seconds.
        t0 = self.util[0][0] if self.util else 0
        self.stats = util_stats([((ts - t0) / 1e6, v) for ts, v in self.util])
        self.stats_version, self.stats_time = self.version, now


class Sampler:
    def __init__(
        self,
        session: Session,
        *,
        interval: float = 0.1,
        window: float = 30.0,
        step_bytes: int = 2 * 1024 * 1024,
        stats_every: float = 1.0,
        collect_every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.session = session
        self.interval = interval
        self.window = window
        self.step_bytes = step_bytes
        self.stats_every = stats_every
        self.collect_every = collect_every
        self._clock = clock
        self._wall = wall
        self._cpu_clock = cpu_clock
        self._collect: Callable[[float | None], None] | None = None
        self._last_collect = -float("inf")
        self.last_tick_at: float | None = None  # monotonic time of the last poll (sample age "sampler")
        self.cpu_seconds_total = 0.0
        self._windows: dict[str, DeviceWindow] = {}
        self._event_set: Any = None
        self._event_generation = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks_total = 0
        self.errors_total = 0

    # --- reading (scrape side) ---

    def window_for(self, uuid: str) -> DeviceWindow | None:
        return self._windows.get(uuid)

    def util_stats(self, uuid: str) -> UtilStats | None:
        """The statistics as of the last recomputation (at most ``stats_every`` seconds old)."""
        w = self._windows.get(uuid)
        return w.stats if w is not None else None

    def memory_window(self, uuid: str) -> MemoryWindow | None:
        with self.session.lock:
            w = self._windows.get(uuid)
            return memory_window([used for _, used in w.memory]) if w is not None else None

    # --- the thread ---

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self.session.lock:
            self._free_event_set()

    def _run(self) -> None:
        next_tick = self._clock()
        while not self._stop.is_set():
            try:
                self.tick(wait=self.collect_every)  # a collector that hangs keeps its last reading
            except Exception:  # the sampler must outlive any bug in one tick
                log.exception("sampler tick failed")
                self.errors_total += 1
            next_tick += self.interval
            now = self._clock()
            if next_tick < now:  # fell behind (a slow scrape held the lock): skip, do not burst
                next_tick = now + self.interval
            self._stop.wait(next_tick - now)

    def set_collection(self, collect: Callable[[float | None], None] | None) -> None:
        """The collectors' sampling pass, ``collect(timeout)``, run by :meth:`tick` every ``collect_every`` s."""
        self._collect = collect

    def tick(self, *, collect: bool = False, wait: float | None = None) -> None:
        """One poll of every GPU, then the collectors' pass when due or when ``collect`` asks for it, waiting
        for it at most ``wait`` seconds (None: until every collector returns). Public so tests and benchmarks
        can drive it without the thread; the thread waits at most ``collect_every``."""
        cpu0 = self._cpu_clock()
        try:
            self._poll_all()
            now = self._clock()
            if self._collect is not None and (collect or now - self._last_collect >= self.collect_every):
                self._last_collect = now
                self._collect(wait)
        finally:
            self.cpu_seconds_total += max(0.0, self._cpu_clock() - cpu0)

    def _poll_all(self) -> None:
        scrape = Scrape(self.session, "sampler")
        self.session.ensure()  # a re-initialisation, if due, before the calls (never during them)
        with self.session.calls():
            devices = self.session.devices()
            if self._event_generation != self.session.generation:
                self._reset_events(devices, scrape)
            now = self._clock()
            for dev in devices:
                self._poll(dev, scrape, now)
            self._drain_xids(devices, scrape)
            self.last_tick_at = now
        self.ticks_total += 1
        if not scrape.ok:
            self.errors_total += 1

    def _window(self, uuid: str) -> DeviceWindow:
        w = self._windows.get(uuid)
        if w is None:
            w = self._windows[uuid] = DeviceWindow(steps=StepDetector(self.step_bytes))
        return w

    def _poll(self, dev: Device, scrape: Scrape, now: float) -> None:
        """The NVML reads outside the session lock; the window updates under it (collectors read them)."""
        nvml = self.session.nvml
        w = self._window(dev.uuid)
        samples = scrape.read(dev, nvml.util_samples, dev.handle, w.last_ts_us)
        mem = scrape.read(dev, nvml.memory, dev.handle)
        with self.session.lock:
            self._update(w, samples, mem, now)
            w.refresh_stats(now, self.stats_every)

    def _update(self, w: DeviceWindow, samples: list[tuple[int, float]] | None, mem: Any, now: float) -> None:
        if samples:
            w.util.extend(s for s in samples if s[0] > w.last_ts_us)
            w.last_ts_us = max(w.last_ts_us, samples[-1][0])
            horizon = w.last_ts_us - int(self.window * 1e6)
            while w.util and w.util[0][0] < horizon:
                w.util.popleft()
            w.version += 1
        if mem is not None:
            w.memory.append((now, mem.used))
            while w.memory and w.memory[0][0] < now - self.window:
                w.memory.popleft()
            step = w.steps.update(mem.used)
            if step is not None:
                w.step_count += 1
                w.step_bytes += step

    # --- XID events: one event set for all GPUs, drained without blocking ---

    def _free_event_set(self) -> None:
        if self._event_set is not None:
            try:
                self.session.nvml.event_set_free(self._event_set)
            except NvmlError as err:
                log.debug("nvmlEventSetFree: %s", err)
            self._event_set = None

    def _reset_events(self, devices: list[Device], scrape: Scrape) -> None:
        self._free_event_set()
        self._event_generation = self.session.generation
        if not devices:
            self._event_generation = -1  # try again once GPUs are visible
            return
        nvml = self.session.nvml
        self._event_set = scrape.read(None, nvml.event_set_create)
        for dev in devices:
            w = self._window(dev.uuid)
            w.xid_registered = False
            if self._event_set is None:
                continue
            try:
                nvml.register_xid_events(dev.handle, self._event_set)
                w.xid_registered = True
            except NvmlError as err:
                scrape.fail(dev, err)

    def _drain_xids(self, devices: list[Device], scrape: Scrape) -> None:
        if self._event_set is None:
            return
        by_index = {d.index: d for d in devices}
        for _ in range(_XID_DRAIN_PER_TICK):
            try:
                event = self.session.nvml.event_wait(self._event_set, 0)
            except NvmlError as err:
                if err.kind is ErrorKind.DEVICE_LOST:
                    # The event names no device we can trust; the per-GPU polls find which one is lost.
                    log.error("XID event wait: %s", err)
                    self.session.record_error("sampler", err)
                else:
                    scrape.fail(None, err)
                return
            if event is None:
                return
            dev = by_index.get(event.gpu_index)
            if dev is None:
                continue
            w = self._window(dev.uuid)
            with self.session.lock:  # the errors collector reads these under it
                code = event.xid if event.xid in w.xid_counts or len(w.xid_counts) < MAX_XID_CODES else XID_OTHER
                w.xid_counts[code] = w.xid_counts.get(code, 0) + 1
                w.xid_total += 1
                w.xid_last_time = self._wall()
            log.warning("GPU %d (%s): XID %d", dev.index, dev.uuid, event.xid)
