"""The device side of a multi-adapter run (guide 2.2, analysis ``multi_lora``): how device memory grows as each of
a trial's adapters becomes resident, the allocator's fragmentation, and GPU utilisation while the load runs.

Two sources of allocator figures, one code path:

- the sim's ``GET /sim/device-state`` (docs/device-state.md): ``devices[0].allocator`` (the fields of
  ``torch.cuda.memory_stats()``) and ``memory_by_owner.activations``;
- the in-process probe's documents (docs/probe-documents.md) in ``--device-probe-dir``, written by the serving
  process's ``exporters.probe`` on a CUDA host: ``devices[0]`` of the newest document that has a device.

Both become a :class:`loadlens.contracts.allocator_math.AllocatorReading`. Before the load, for each adapter of
the trial in order: read, send one 1-token request to the adapter (the server moves it into a GPU slot: on the
sim that is when its modules are allocated; ``POST /v1/load_lora_adapter`` only reads it into the host cache),
read again. A 1-token request to the base model goes first, so the activations' working set is the same in every
reading. Utilisation comes only from ``/sim/device-state``'s ``util_samples`` (followed with ``since_us``, every
``poll_interval`` seconds, at the sim's native 10 ms); a server without it gives null utilisation figures.

Usage (the runner's hook)::

    device = DeviceWatch.start(opts.device, url, trial.adapters)   # the VRAM steps, before the load
    with device:                                                   # utilisation samples while the load runs
        ...
    figures = device.figures(measured_windows)                     # vram.*, frag.*, util.* (absent: no watch)
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from loadlens.contracts.allocator_math import AllocatorReading, fragmentation
from loadlens.contracts.busy_math import busy_stats, util_figures
from loadlens.contracts.probe_document import ProbeDocument
from loadlens.util.probe_directory import ProbeReader

DEVICE_STATE_PATH = "/sim/device-state"
TOUCH_PROMPT = "hi"
"""The 1-token requests' prompt: shorter than one 16-token block, so no prefix cache hit changes its work."""


def _get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _touch(url: str, model: str, token: str | None = None) -> None:
    """One 1-token completion for ``model``: makes the server move that adapter into a GPU slot."""
    body = {"model": model, "prompt": TOUCH_PROMPT, "max_tokens": 1, "temperature": 0}
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(req, timeout=120.0) as resp:
        resp.read()


@dataclass(frozen=True)
class Reading:
    """One allocator reading, with the activations' share of it where the source breaks memory down."""

    allocator: AllocatorReading
    activations: int | None
    at: float


def reading_from_sim(doc: dict[str, Any]) -> Reading | None:
    """``devices[0]`` of a ``/sim/device-state`` document (None without devices)."""
    devices = doc.get("devices") or []
    if not devices:
        return None
    dev = devices[0]
    alloc = dev["allocator"]
    fields = AllocatorReading.__dataclass_fields__
    return Reading(
        AllocatorReading(**{k: alloc[k] for k in fields}),
        int(dev["memory_by_owner"]["activations"]),
        float(doc["timestamp_us"]) / 1e6,
    )


def reading_from_probe(doc: ProbeDocument) -> Reading | None:
    """``devices[0]`` of a probe document (None without devices: a CPU worker's events-only document)."""
    if not doc.devices:
        return None
    dev = doc.devices[0]
    fields = AllocatorReading.__dataclass_fields__
    return Reading(AllocatorReading(**{k: getattr(dev, k) for k in fields}), None, dev.stats_at)


class SimSource:
    """Allocator readings from the server's ``/sim/device-state``."""

    name = "sim"

    def __init__(self, url: str) -> None:
        self.url = url

    def read(self, after: float | None = None, adapter: tuple[str, float] | None = None) -> Reading | None:
        since = int(time.time() * 1e6)  # no utilisation samples wanted here
        try:
            return reading_from_sim(_get_json(f"{self.url}{DEVICE_STATE_PATH}?since_us={since}"))
        except (OSError, ValueError, KeyError):
            return None


class ProbeSource:
    """Allocator readings from the newest probe document with a device in ``directory``. ``after`` waits (up
    to two probe intervals + 1 s) for a document whose stats were read after that time, or, with ``adapter``
    (name, when its request was sent), after the end of a load of that adapter the document records: the
    probe publishes at once after a recorded load (docs/probe-documents.md), often before the request ends."""

    name = "probe"

    def __init__(self, directory: Path, *, proc_root: str | None = "/proc", poll: float = 0.05) -> None:
        self.reader = ProbeReader(directory, proc_root=proc_root)
        self.poll = poll

    def _newest(self, adapter: tuple[str, float] | None) -> tuple[Reading, float, float] | None:
        """The newest reading, its document's interval and the time it must be newer than (inf: none)."""
        best: tuple[Reading, float, float] | None = None
        for doc in self.reader.read().documents:
            r = reading_from_probe(doc)
            if r is None or (best is not None and r.at <= best[0].at):
                continue
            ends = [e.end for e in doc.events.lora_loads if adapter and e.adapter == adapter[0] and e.end >= adapter[1]]
            best = (r, doc.interval_seconds, max(ends) if ends else math.inf)
        return best

    def read(self, after: float | None = None, adapter: tuple[str, float] | None = None) -> Reading | None:
        found = self._newest(adapter)
        if after is None or found is None:
            return found[0] if found else None

        def fresh(f: tuple[Reading, float, float]) -> bool:
            return f[0].at >= min(after, f[2])

        deadline = time.monotonic() + 2 * found[1] + 1.0
        while not fresh(found) and time.monotonic() < deadline:
            time.sleep(self.poll)
            found = self._newest(adapter) or found
        return found[0] if fresh(found) else None


def _delta(before: Reading | None, after: Reading | None) -> dict[str, float | None]:
    """One adapter's step: requested and allocated bytes it added (the activations' change taken out where
    known), reserved bytes the allocator added, rounding overhead = allocated − requested and its share."""
    if before is None or after is None:
        return dict.fromkeys(("requested_bytes", "allocated_bytes", "reserved_bytes", "rounding_overhead_bytes",
                              "rounding_overhead_ratio"))  # fmt: skip
    b, a = before.allocator, after.allocator
    act = (after.activations or 0) - (before.activations or 0)
    requested = a.requested_bytes - b.requested_bytes - act
    allocated = a.allocated_bytes - b.allocated_bytes - act
    overhead = allocated - requested
    return {
        "requested_bytes": float(requested),
        "allocated_bytes": float(allocated),
        "reserved_bytes": float(a.reserved_bytes - b.reserved_bytes),
        "rounding_overhead_bytes": float(overhead),
        "rounding_overhead_ratio": overhead / allocated if allocated > 0 else None,
    }


def fragmentation_figures(r: Reading | None) -> dict[str, float | None]:
    """``frag.free_block_ratio`` = 1 − largest free block / total free (LLNL Umpire's, allocator_math), and
    ``frag.inactive_split_ratio`` = inactive split bytes / reserved bytes."""
    if r is None:
        return {"frag.free_block_ratio": None, "frag.inactive_split_ratio": None, "frag.reserved_bytes": None}
    a = r.allocator
    return {
        "frag.free_block_ratio": fragmentation(a.largest_free_block_bytes, a.total_free_bytes),
        "frag.inactive_split_ratio": a.inactive_split_bytes / a.reserved_bytes if a.reserved_bytes else None,
        "frag.reserved_bytes": float(a.reserved_bytes),
    }


@dataclass
class DeviceWatch:
    """What the multi_lora analysis asks the runner to measure; ``probe_dir`` (``--device-probe-dir``) takes
    the allocator figures from the probe's documents instead of ``/sim/device-state``."""

    probe_dir: Path | None = None
    poll_interval: float = 0.5
    token: str | None = None

    def source(self, url: str) -> SimSource | ProbeSource:
        return ProbeSource(self.probe_dir) if self.probe_dir is not None else SimSource(url)

    @staticmethod
    def start(watch: DeviceWatch | None, url: str, adapters: tuple[str, ...]) -> DeviceSession:
        """The VRAM steps of ``adapters`` (now), and a session that samples utilisation inside its ``with``."""
        if watch is None:
            return DeviceSession(None, url)
        session = DeviceSession(watch, url)
        session.adapter_steps(adapters)
        return session


@dataclass
class DeviceSession:
    watch: DeviceWatch | None
    url: str
    steps: dict[str, dict[str, float | None]] = field(default_factory=dict)
    samples: dict[int, float] = field(default_factory=dict)
    intervals: dict[int, int] = field(default_factory=dict)  # busy timeline: start µs -> end µs
    interval: float | None = None
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def adapter_steps(self, adapters: tuple[str, ...]) -> None:
        assert self.watch is not None
        source = self.watch.source(self.url)
        try:
            base = _get_json(f"{self.url}/v1/models")["data"][0]["id"]
            _touch(self.url, base, self.watch.token)
            for name in adapters:
                before = source.read()
                sent = time.time()
                _touch(self.url, name, self.watch.token)
                self.steps[name] = _delta(before, source.read(after=time.time(), adapter=(name, sent)))
        except (OSError, ValueError, KeyError, IndexError) as err:
            self.errors.append(f"adapter steps: {err}")

    def __enter__(self) -> DeviceSession:
        if self.watch is not None:
            self._thread = threading.Thread(target=self._loop, name="device-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        assert self.watch is not None
        since = int(time.time() * 1e6)
        while not self._stop.is_set():
            try:
                doc = _get_json(f"{self.url}{DEVICE_STATE_PATH}?since_us={since}")
                dev = doc["devices"][0]
                self.interval = float(dev["sample_interval_seconds"])
                for s in dev["util_samples"]:
                    self.samples[int(s["timestamp_us"])] = float(s["gpu_percent"])
                    since = max(since, int(s["timestamp_us"]))
                for iv in dev.get("busy_intervals") or ():  # version 3: the step schedule's busy timeline
                    self.intervals[int(iv["start_us"])] = int(iv["end_us"])
            except urllib.error.HTTPError as err:
                self.errors.append(f"GET {DEVICE_STATE_PATH}: HTTP {err.code}: no utilisation samples")
                return  # not the sim: nothing to follow
            except (OSError, ValueError, KeyError, IndexError) as err:
                if len(self.errors) < 5:
                    self.errors.append(f"GET {DEVICE_STATE_PATH}: {err}")
            self._stop.wait(self.watch.poll_interval)

    def figures(self, windows: list[tuple[float, float]]) -> dict[str, float | None]:
        if self.watch is None:
            return {}
        out: dict[str, float | None] = {}
        for name, step in self.steps.items():
            out.update({f"vram.{name}.{k}": v for k, v in step.items()})
        allocated = [s["allocated_bytes"] for s in self.steps.values()]
        requested = [s["requested_bytes"] for s in self.steps.values()]
        reserved = [s["reserved_bytes"] for s in self.steps.values()]
        known = self.steps and all(v is not None for v in (*allocated, *requested, *reserved))
        total_alloc = sum(v or 0.0 for v in allocated) if known else None
        total_req = sum(v or 0.0 for v in requested) if known else None
        out["vram.adapters_requested_bytes"] = total_req
        out["vram.adapters_allocated_bytes"] = total_alloc
        out["vram.adapters_reserved_bytes"] = sum(v or 0.0 for v in reserved) if known else None
        overhead = total_alloc - total_req if total_alloc is not None and total_req is not None else None
        out["vram.rounding_overhead_bytes"] = overhead
        out["vram.rounding_overhead_ratio"] = overhead / total_alloc if overhead is not None and total_alloc else None
        assert self.watch is not None
        out.update(fragmentation_figures(self.watch.source(self.url).read()))
        inside = sorted(
            (ts / 1e6, v) for ts, v in self.samples.items() if any(lo <= ts / 1e6 <= hi for lo, hi in windows)
        )
        out.update(util_figures(inside, self.interval))
        out.update(busy_figures([(a / 1e6, b / 1e6) for a, b in self.intervals.items()], windows))
        return out


BUSY_KEYS = ("ratio_pct", "swing_pct", "period_ms", "run_p50_ms", "run_p95_ms", "gap_p50_ms", "gap_p95_ms",
             "gap_max_ms", "resolution_ms")  # fmt: skip


def busy_figures(intervals: list[tuple[float, float]], windows: list[tuple[float, float]]) -> dict[str, float | None]:
    """``busy.*``: the busy timeline's figures (loadlens.contracts.busy_math) in each measured window, averaged
    over the windows (a null in one window is left out); all null without a timeline (a server whose
    /sim/device-state has no ``busy_intervals``, or none at all)."""
    out: dict[str, list[float]] = {k: [] for k in BUSY_KEYS}
    for lo, hi in windows if intervals else ():
        if hi <= lo:
            continue
        s = busy_stats(intervals, lo, hi)
        values = {
            "ratio_pct": 100.0 * s.busy_ratio,
            "swing_pct": None if s.swing_ratio is None else 100.0 * s.swing_ratio,
            "period_ms": None if s.period_seconds is None else 1e3 * s.period_seconds,
            "run_p50_ms": None if s.busy_run is None else 1e3 * s.busy_run.p50,
            "run_p95_ms": None if s.busy_run is None else 1e3 * s.busy_run.p95,
            "gap_p50_ms": None if s.idle_gap is None else 1e3 * s.idle_gap.p50,
            "gap_p95_ms": None if s.idle_gap is None else 1e3 * s.idle_gap.p95,
            "gap_max_ms": None if s.idle_gap is None else 1e3 * s.idle_gap.max,
            "resolution_ms": 1e3 * s.resolution_seconds,
        }
        for k, v in values.items():
            if v is not None:
                out[k].append(v)
    return {f"busy.{k}": (sum(v) / len(v) if v else None) for k, v in out.items()}
