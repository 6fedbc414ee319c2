"""Per-process allocator state from the in-process probes' documents (``--probe-dir``; docs/probe-documents.md).

Each document becomes the ``loadlens_gpu_allocator_*`` series of the sim's allocator model with two more
labels, ``pid`` and ``role``, joined to this exporter's GPU labels by UUID (a GPU NVML does not list keeps
``gpu=""`` and the probe's device name as ``model``), plus the probe's own series: pools, allocator config,
LoRA loads, CUDA graph capture time, the busy timeline's ``loadlens_gpu_busy_*`` (exporters/gpu/busy.py),
and the documents read and dropped. A bad document is dropped and
counted, never a failed scrape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric

from exporters.gpu.allocator import allocator_families, reading_from_state
from exporters.gpu.busy import BusyFamilies
from exporters.gpu.collector import DEVICE_LABELS, GpuCollector, Scrape, counter, gauge
from exporters.gpu.registration import BuildContext, register_collector
from exporters.gpu.session import Session
from loadlens.contracts.allocator_math import AllocatorReading

if TYPE_CHECKING:
    # Pydantic models: imported only where the collector is built, so a lean install without pydantic
    # still starts the nvml backend (the probe collector then cannot be selected).
    from loadlens.contracts.probe_document import ProbeDocument
    from loadlens.util.probe_directory import ProbeReader

# As loadlens.util.probe_directory.DROP_REASONS (a test keeps them equal).
DROP_REASONS = ("corrupt", "version", "stale", "pid_gone", "pid_reused", "duplicate", "too_large", "too_many")

PROCESS_LABELS = ("pid", "role")
DEVICE_PROCESS_LABELS = (*DEVICE_LABELS, *PROCESS_LABELS)
POOL_LABELS = (*DEVICE_PROCESS_LABELS, "pool", "size_class")
# Allocator options become label values: keep them few, short and well-formed.
_OPTION = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
MAX_OPTIONS = 16
MAX_VALUE = 64


class ProbeCollector(GpuCollector):
    """Source: every fresh document in the probe directory; the GPU labels come from NVML by UUID."""

    name = "probe"

    def __init__(self, session: Session, *, reader: ProbeReader | None, **kwargs: Any) -> None:
        self._reader = reader
        super().__init__(session, **kwargs)

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        if self._reader is None:
            return  # built without a directory (the CLI never does that): nothing to read
        result = self._reader.read()
        if not result.listed:
            scrape.ok = False
        # Not scrape.devices(): no GPU from NVML is no failure here, the documents stand on their own.
        by_uuid = {d.uuid: d.labels for d in self.session.devices()}
        now = self._clock()
        readings: list[tuple[Sequence[str], AllocatorReading]] = []
        pools = gauge("allocator_pool_segments", "Allocator segments by pool and size class.", POOL_LABELS)
        pool_bytes = gauge(
            "allocator_pool_reserved_bytes", "Bytes reserved by segments of a pool and size class.", POOL_LABELS
        )
        snap_age = gauge(
            "probe_snapshot_age_seconds",
            "Seconds since the memory_snapshot() behind the free-block series.",
            DEVICE_PROCESS_LABELS,
        )
        fams = _ProcessFamilies()
        busy = BusyFamilies(DEVICE_PROCESS_LABELS)
        for doc in result.documents:
            proc = [str(doc.pid), doc.role]
            if doc.busy is not None:  # a CPU timeline has no device: gpu, uuid and model are ""
                gpu, uuid, model = by_uuid.get(doc.busy.uuid, ("", doc.busy.uuid, ""))
                busy.add([gpu, uuid, model, *proc], doc.busy)
            for d in doc.devices:
                gpu, uuid, model = by_uuid.get(d.uuid, ("", d.uuid, d.name))
                labels = [gpu, uuid, model, *proc]
                readings.append((labels, reading_from_state(d)))
                for p in d.pools:
                    pools.add_metric([*labels, p.pool, p.size_class], float(p.segments))
                    pool_bytes.add_metric([*labels, p.pool, p.size_class], float(p.reserved_bytes))
                if d.snapshot_at is not None:
                    snap_age.add_metric(labels, max(0.0, now - d.snapshot_at))
            fams.add(doc, proc, now)
        yield from allocator_families(readings, DEVICE_PROCESS_LABELS)
        yield from (pools, pool_bytes, snap_age)
        yield from fams.families()
        yield from busy.families()
        docs = gauge("probe_documents", "Probe documents read and kept this scrape.", [])
        docs.add_metric([], float(len(result.documents)))
        dropped = gauge("probe_documents_dropped", "Probe documents dropped this scrape, by reason.", ["reason"])
        dropped_total = counter(
            "probe_documents_dropped", "Probe documents dropped, each version of a file once, by reason.", ["reason"]
        )
        for reason in DROP_REASONS:
            dropped.add_metric([reason], float(result.dropped[reason]))
            dropped_total.add_metric([reason], float(self._reader.dropped_total[reason]))
        yield from (docs, dropped, dropped_total)


class _ProcessFamilies:
    """The per-process (not per-device) families."""

    def __init__(self) -> None:
        p = PROCESS_LABELS
        self.info = gauge(
            "probe_info",
            "1 per probed process: its hostname, torch version and allocator backend.",
            (*p, "hostname", "torch_version", "allocator_backend"),
        )
        self.config = gauge(
            "allocator_config_info", "1 per allocator option in force (PYTORCH_ALLOC_CONF).", (*p, "option", "value")
        )
        self.doc_age = gauge("probe_document_age_seconds", "Seconds since the probe wrote its document.", p)
        self.snap_cost = gauge("probe_snapshot_duration_seconds", "What the last memory_snapshot() cost.", p)
        self.snap_every = gauge(
            "probe_snapshot_interval_seconds", "Current interval between snapshots (backs off when costly).", p
        )
        self.loads = counter("probe_lora_loads", "LoRA adapter loads, by trigger.", (*p, "trigger"))
        self.load_seconds = counter(
            "probe_lora_load_seconds", "Seconds spent loading LoRA adapters, by trigger.", (*p, "trigger")
        )
        self.last_duration = gauge("probe_lora_last_load_duration_seconds", "Duration of the last LoRA load.", p)
        self.last_end = gauge("probe_lora_last_load_timestamp_seconds", "Unix time the last LoRA load finished.", p)
        self.graphs = gauge("probe_cuda_graph_capture_seconds", "Seconds spent capturing CUDA graphs.", p)

    def add(self, doc: ProbeDocument, proc: list[str], now: float) -> None:
        self.info.add_metric([*proc, doc.hostname, doc.torch_version, doc.allocator_backend], 1.0)
        options = [(k, v) for k, v in sorted(doc.allocator_config.items()) if _OPTION.match(k)]
        for key, value in options[:MAX_OPTIONS]:
            self.config.add_metric([*proc, key, value[:MAX_VALUE]], 1.0)
        self.doc_age.add_metric(proc, max(0.0, now - doc.written_at))
        if doc.snapshot_duration_seconds is not None:
            self.snap_cost.add_metric(proc, doc.snapshot_duration_seconds)
        if doc.snapshot_interval_seconds is not None:  # null in a process without CUDA: it takes no snapshots
            self.snap_every.add_metric(proc, doc.snapshot_interval_seconds)
        ev = doc.events
        self.loads.add_metric([*proc, "on_demand"], float(ev.lora_on_demand_loads_total))
        self.loads.add_metric([*proc, "preload"], float(ev.lora_loads_total - ev.lora_on_demand_loads_total))
        self.load_seconds.add_metric([*proc, "on_demand"], ev.lora_on_demand_load_seconds_total)
        self.load_seconds.add_metric(
            [*proc, "preload"], max(0.0, ev.lora_load_seconds_total - ev.lora_on_demand_load_seconds_total)
        )
        if ev.lora_loads:
            last = ev.lora_loads[-1]
            self.last_duration.add_metric(proc, max(0.0, last.end - last.start))
            self.last_end.add_metric(proc, last.end)
        if ev.cuda_graph_capture_seconds is not None:
            self.graphs.add_metric(proc, ev.cuda_graph_capture_seconds)

    def families(self) -> list[Metric]:
        return [
            self.info,
            self.config,
            self.doc_age,
            self.snap_cost,
            self.snap_every,
            self.loads,
            self.load_seconds,
            self.last_duration,
            self.last_end,
            self.graphs,
        ]


def _build(ctx: BuildContext) -> ProbeCollector:
    from loadlens.util.probe_directory import ProbeReader

    if ctx.probe_dir is None:
        return ProbeCollector(ctx.session, reader=None, timer=ctx.timer, clock=ctx.clock)
    # "/proc" whatever the backend: probes are real processes even when the GPUs are simulated.
    reader = ProbeReader(ctx.probe_dir, proc_root="/proc", clock=ctx.clock)
    return ProbeCollector(ctx.session, reader=reader, timer=ctx.timer, clock=ctx.clock)


# Opt-in: the CLI adds it whenever --probe-dir is given (a directory is what enables it).
register_collector(ProbeCollector.name, default=False, factory=_build)
