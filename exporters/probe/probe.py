"""The in-process allocator probe: a daemon thread that reads ``torch.cuda`` and publishes a document.

In a process whose torch has no CUDA (a CPU build, vLLM's CPU worker) it reads nothing and publishes the
process's events only: no devices, no stats or snapshot figures.

Every ``interval`` seconds it reads ``memory_stats(i)`` for each device this process uses (cheap: counters
under the allocator's lock), and every ``snapshot_interval`` seconds ``memory_snapshot()`` (walks every
block while holding the allocator's lock and the GIL, so it is the probe's real cost). It never calls
``torch.cuda.synchronize`` or anything that launches work or creates a CUDA context: until CUDA is
initialised in this process it publishes a document without devices.

Back-off: the snapshot interval is ``max(snapshot_interval, cost / snapshot_budget)``, capped at
``max_snapshot_interval``; with the default budget (1 %) a snapshot that takes 0.5 s is taken at most
every 50 s, and the interval comes back down when snapshots get cheap again.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from exporters.probe.reading import SnapshotSummary, device_entry, summarise_snapshot, used
from exporters.probe.timeline import BusyTimeline
from exporters.probe.writer import atomic_write, document_name, remove
from loadlens.contracts.allocator_math import parse_alloc_conf
from loadlens.contracts.probe_document import (
    MAX_LORA_EVENTS,
    PROBE_DOCUMENT_VERSION,
    LoraLoad,
    ProbeDevice,
    ProbeDocument,
    ProbeEvents,
)
from loadlens.util.busy_report import BusyReport
from loadlens.util.cuda_device import device_uuid
from loadlens.util.procstat import pid_namespace, start_time_ticks

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 5.0
DEFAULT_SNAPSHOT_INTERVAL = 30.0
DEFAULT_MAX_SNAPSHOT_INTERVAL = 600.0
DEFAULT_SNAPSHOT_BUDGET = 0.01
EARLY_WRITE_GAP_S = 0.05  # least time between two writes that LoRA loads brought forward


def alloc_conf(env: Mapping[str, str]) -> dict[str, str]:
    """The allocator settings as torch reads them: PYTORCH_ALLOC_CONF, else the older PYTORCH_CUDA_ALLOC_CONF."""
    text = env.get("PYTORCH_ALLOC_CONF")
    if text is None:
        text = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return parse_alloc_conf(text)


class Probe:
    def __init__(
        self,
        role: str,
        directory: str | os.PathLike[str],
        torch: Any,
        *,
        interval: float = DEFAULT_INTERVAL,
        snapshot_interval: float = DEFAULT_SNAPSHOT_INTERVAL,
        max_snapshot_interval: float = DEFAULT_MAX_SNAPSHOT_INTERVAL,
        snapshot_budget: float = DEFAULT_SNAPSHOT_BUDGET,
        env: Mapping[str, str] | None = None,
        hostname: str | None = None,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.role = role
        self.directory = Path(directory)
        self._torch = torch
        cuda = getattr(torch, "cuda", None)
        # Without CUDA (a CPU build of torch, vLLM's CPU worker) the document has no devices, only events.
        self._cuda: Any = cuda if cuda is not None and cuda.is_available() else None
        self.interval = interval
        self.base_snapshot_interval = snapshot_interval
        self.snapshot_interval = snapshot_interval
        self._max_snapshot_interval = max(max_snapshot_interval, snapshot_interval)
        self._budget = snapshot_budget
        self._clock, self._timer = clock, timer
        self.pid = os.getpid()
        self._start_ticks = start_time_ticks(self.pid)
        self._pid_ns = pid_namespace()
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self.path = self.directory / document_name(self.hostname, self.pid)
        self._config = alloc_conf(os.environ if env is None else env)
        self._names: dict[int, tuple[str, str]] = {}
        self._summaries: dict[int, SnapshotSummary] = {}
        self._next_snapshot = -float("inf")
        self.snapshot_duration: float | None = None
        self.stats_duration = 0.0
        self.ticks_total = 0
        self.errors_total = 0
        self._logged_errors: set[str] = set()
        self._events_lock = threading.Lock()
        self._tick_lock = threading.Lock()
        self._lora: collections.deque[LoraLoad] = collections.deque(maxlen=MAX_LORA_EVENTS)
        self._lora_counts = [0, 0]  # all, on demand
        self._lora_seconds = [0.0, 0.0]
        self._graph_seconds: float | None = None
        self._busy: BusyReport | None = None
        self._timeline: BusyTimeline | None = None
        self._stop = threading.Event()
        self._publish = threading.Event()  # set by record_lora_load: publish without waiting for the interval
        self._thread: threading.Thread | None = None
        self._stopped = False

    # --- public API ---

    def start(self) -> Probe:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write_now()
        self._thread = threading.Thread(target=self._run, name="loadlens-probe", daemon=True)
        self._thread.start()
        atexit.register(self._remove_document)
        return self

    def record_lora_load(
        self, adapter: str, rank: int | None, start: float, end: float, *, on_demand: bool, source: str = "storage"
    ) -> None:
        """One adapter load into a GPU slot (Unix times), read from storage or moved from vLLM's CPU cache; kept
        in a ring of the last MAX_LORA_EVENTS plus running totals."""
        try:
            event = LoraLoad(
                adapter=adapter[:256],
                rank=rank,
                start=start,
                end=end,
                on_demand=on_demand,
                source=source,  # type: ignore[arg-type]  # validated by the model
            )
        except Exception as err:  # a bad call from a plugin must not break the serving process
            self._error("record_lora_load", err)
            return
        seconds = max(0.0, end - start)
        with self._events_lock:
            self._lora.append(event)
            self._lora_counts[0] += 1
            self._lora_seconds[0] += seconds
            if on_demand:
                self._lora_counts[1] += 1
                self._lora_seconds[1] += seconds
        # A reader attributing stream stalls to swaps (the proxy's swap feed) wants the window soon; the
        # write itself happens on the probe's thread, never on the caller's (vLLM's model runner).
        self._publish.set()

    def record_cuda_graph_capture(self, seconds: float) -> None:
        """Time spent capturing CUDA graphs; several calls add up."""
        if not seconds >= 0:  # also refuses NaN
            return
        with self._events_lock:
            self._graph_seconds = (self._graph_seconds or 0.0) + float(seconds)

    def busy_timeline(self, source: str) -> BusyTimeline:
        """A busy timeline of this process's current CUDA device (or of the CPU without CUDA) whose figures the
        document carries from now on (``busy``); its ``begin``/``end`` go around the work to time
        (exporters.probe.timeline). One per probe: a second call returns the first."""
        if self._timeline is None:
            timeline = BusyTimeline(self._torch, source=source, timer=self._timer, wall=self._clock)
            uuid = device_uuid(self._cuda, timeline.cuda_index) if timeline.cuda_index is not None else ""
            self._busy = BusyReport(timeline, uuid=uuid)
            self._timeline = timeline
        return self._timeline

    def write_now(self) -> None:
        """Read the allocator (a snapshot too when one is due) and publish at once; never raises."""
        if os.getpid() != self.pid or self._stopped:
            return  # a forked child must not overwrite its parent's document
        with self._tick_lock:
            try:
                doc = self.document()
                atomic_write(self.path, doc.model_dump_json().encode())
                self.ticks_total += 1
            except Exception as err:
                self._error("write", err)

    def stop(self) -> None:
        """Stop the thread and remove this process's document (idempotent)."""
        self._stopped = True
        self._stop.set()
        self._publish.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(5.0, self.interval))
        atexit.unregister(self._remove_document)
        self._remove_document()

    # --- internals ---

    def _remove_document(self) -> None:
        if os.getpid() == self.pid:
            try:
                remove(self.path)
            except OSError as err:
                self._error("remove", err)

    def _run(self) -> None:
        # Every interval, and soon after a LoRA load (at most one early write per EARLY_WRITE_GAP_S, so a burst
        # of loads costs a few writes, not one per load).
        while not self._stop.is_set():
            woken = self._publish.wait(self.interval)
            if self._stop.is_set():
                return
            if woken:
                self._publish.clear()
            self.write_now()
            if woken and self._stop.wait(EARLY_WRITE_GAP_S):
                return

    def _error(self, where: str, err: BaseException) -> None:
        self.errors_total += 1
        key = f"{where}:{type(err).__name__}"
        level = logging.DEBUG if key in self._logged_errors else logging.WARNING
        self._logged_errors.add(key)
        log.log(level, "loadlens probe: %s failed: %s: %s", where, type(err).__name__, err)

    def _snapshot(self, devices: list[int], now: float) -> None:
        start = self._timer()
        try:
            snapshot = self._cuda.memory_snapshot(include_traces=False)  # lighter where torch supports it
        except TypeError:
            snapshot = self._cuda.memory_snapshot()
        self._summaries = summarise_snapshot(snapshot, devices, now)
        del snapshot
        cost = self._timer() - start
        self.snapshot_duration = cost
        wanted = cost / self._budget if self._budget > 0 else 0.0
        self.snapshot_interval = min(self._max_snapshot_interval, max(self.base_snapshot_interval, wanted))
        self._next_snapshot = now + self.snapshot_interval

    @property
    def has_cuda(self) -> bool:
        """Whether this process's torch has CUDA; without it the document carries events only."""
        return self._cuda is not None

    def _devices(self, now: float) -> list[ProbeDevice]:
        cuda = self._cuda
        if cuda is None:
            return []
        if not cuda.is_initialized():
            return []  # reading now would create a CUDA context in a process that has none yet
        start = self._timer()
        stats = {i: cuda.memory_stats(i) for i in range(int(cuda.device_count()))}
        self.stats_duration = self._timer() - start
        mine = [i for i, s in stats.items() if used(s)]
        if mine and now >= self._next_snapshot:
            self._snapshot(mine, now)
        out = []
        for i in mine:
            if i not in self._names:
                self._names[i] = (device_uuid(cuda, i), str(cuda.get_device_name(i)))
            uuid, name = self._names[i]
            out.append(device_entry(i, uuid, name, stats[i], self._summaries.get(i), now))
        return out

    def _backend(self) -> str:
        try:
            cuda = self._cuda
            return str(cuda.get_allocator_backend()) if cuda is not None and cuda.is_initialized() else ""
        except Exception:
            return ""

    def document(self) -> ProbeDocument:
        now = self._clock()
        devices = self._devices(now)
        with self._events_lock:
            events = ProbeEvents(
                lora_loads=list(self._lora),
                lora_loads_total=self._lora_counts[0],
                lora_on_demand_loads_total=self._lora_counts[1],
                lora_load_seconds_total=self._lora_seconds[0],
                lora_on_demand_load_seconds_total=self._lora_seconds[1],
                cuda_graph_capture_seconds=self._graph_seconds,
            )
        busy = None
        if self._busy is not None:
            try:
                busy = self._busy.section(now)
            except Exception as err:
                self._error("busy", err)
        return ProbeDocument(
            version=PROBE_DOCUMENT_VERSION,
            pid=self.pid,
            start_time_ticks=self._start_ticks,
            pid_namespace=self._pid_ns,
            role=self.role,
            hostname=self.hostname[:255],
            written_at=now,
            interval_seconds=self.interval,
            # Absent, not zero, where nothing is read: a process without CUDA takes no stats and no snapshots.
            snapshot_interval_seconds=self.snapshot_interval if self.has_cuda else None,
            snapshot_duration_seconds=self.snapshot_duration,
            stats_duration_seconds=self.stats_duration if self.has_cuda else None,
            torch_version=str(getattr(self._torch, "__version__", "")),
            allocator_backend=self._backend(),
            allocator_config=self._config,
            devices=devices,
            events=events,
            busy=busy,
        )
