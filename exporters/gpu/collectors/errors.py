"""Hardware errors: XID events (from the sampler's event set), ECC errors, remapped rows."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from prometheus_client.core import Metric

from exporters.gpu.collector import DEVICE_LABELS, GpuCollector, Scrape, counter, gauge
from exporters.gpu.registration import BuildContext, register_collector
from exporters.gpu.sampler import XID_OTHER, Sampler
from exporters.gpu.session import Session


class ErrorsCollector(GpuCollector):
    """Sources: nvmlEventSetWait on nvmlEventTypeXidCriticalError (sampler thread),
    nvmlDeviceGetTotalEccErrors (volatile), nvmlDeviceGetRemappedRows."""

    name = "errors"

    def __init__(self, session: Session, *, sampler: Sampler | None = None, **kwargs: Any) -> None:
        self._sampler = sampler
        super().__init__(session, **kwargs)

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        nvml = self.session.nvml
        xid_events = counter("xid_events", "XID critical-error events since the exporter started (all codes).")
        xid_errors = counter("xid_errors", "XID critical-error events by XID code.", [*DEVICE_LABELS, "xid"])
        xid_last = gauge("xid_last_timestamp_seconds", "Unix time of the last XID event.")
        ecc = counter("ecc_errors", "ECC errors since the driver was loaded.", [*DEVICE_LABELS, "type"])
        remapped = gauge("remapped_rows", "Memory rows remapped, by error type.", [*DEVICE_LABELS, "type"])
        pending = gauge("row_remap_pending", "1 if a row remap waits for a GPU reset.")
        failed = gauge("row_remap_failed", "1 if a row remap failed (the GPU needs service).")
        for dev in scrape.devices():
            for kind, corrected in (("corrected", True), ("uncorrected", False)):
                n = scrape.read(dev, partial(nvml.ecc_errors, corrected=corrected), dev.handle)
                if n is not None:
                    ecc.add_metric([*dev.labels, kind], float(n))
            rows = scrape.read(dev, nvml.remapped_rows, dev.handle)
            if rows is not None:
                remapped.add_metric([*dev.labels, "correctable"], float(rows.correctable))
                remapped.add_metric([*dev.labels, "uncorrectable"], float(rows.uncorrectable))
                pending.add_metric(dev.labels, 1.0 if rows.pending else 0.0)
                failed.add_metric(dev.labels, 1.0 if rows.failed else 0.0)
            w = self._sampler.window_for(dev.uuid) if self._sampler is not None else None
            if w is None or not w.xid_registered:
                continue  # XID events unsupported (or no sampler): absent, not 0
            with self.session.lock:  # the sampler's poll updates them under it
                total, counts, last_time = w.xid_total, sorted(w.xid_counts.items()), w.xid_last_time
            xid_events.add_metric(dev.labels, float(total))
            for code, n in counts:
                xid_errors.add_metric([*dev.labels, "other" if code == XID_OTHER else str(code)], float(n))
            if last_time is not None:
                xid_last.add_metric(dev.labels, last_time)
        yield from (xid_events, xid_errors, xid_last, ecc, remapped, pending, failed)


def _build(ctx: BuildContext) -> ErrorsCollector:
    return ErrorsCollector(ctx.session, sampler=ctx.sampler, timer=ctx.timer, clock=ctx.clock)


register_collector(ErrorsCollector.name, default=True, factory=_build)
