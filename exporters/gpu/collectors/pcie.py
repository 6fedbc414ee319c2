"""PCIe throughput (opt-in: each NVML read samples the bus for ~20 ms).

``nvmlDeviceGetPcieThroughput`` blocks for its sampling window. Read one after another, transmit and receive
on N GPUs cost 2 x N windows per scrape: 41 ms for one H200, measured with
``python -m benchmarks.gpu_nvml_check``. The reads are therefore issued concurrently from a small thread pool
(NVML is thread-safe), so a scrape waits about one window, whatever the number of GPUs. Errors are still
classified one read at a time, in the scrape's thread, in the same order as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client.core import Metric

from exporters.gpu.collector import GpuCollector, Scrape, gauge
from exporters.gpu.nvml import NvmlError
from exporters.gpu.registration import BuildContext, register_collector

# 8 GPUs x 2 directions read at once; larger nodes take a second round of windows.
MAX_CONCURRENT_READS = 16


def _reraise(value: float | None, err: NvmlError | None) -> float | None:
    if err is not None:
        raise err
    return value


class PcieCollector(GpuCollector):
    """Source: nvmlDeviceGetPcieThroughput (KiB/s, NVML_PCIE_UTIL_TX_BYTES / RX_BYTES)."""

    name = "pcie"
    _pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        # Created on first use: an exporter without this collector starts no threads.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=MAX_CONCURRENT_READS, thread_name_prefix="pcie-read")
        return self._pool

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        nvml = self.session.nvml
        tx = gauge("pcie_tx_bytes_per_second", "PCIe transmit throughput over NVML's 20 ms sample.")
        rx = gauge("pcie_rx_bytes_per_second", "PCIe receive throughput over NVML's 20 ms sample.")
        reads = [(dev, family, is_tx) for dev in scrape.devices() for family, is_tx in ((tx, True), (rx, False))]
        reads = [r for r in reads if not scrape.skipped(r[0])]

        def read(item: tuple[Any, Any, bool]) -> tuple[float | None, NvmlError | None]:
            dev, _, is_tx = item
            try:
                return nvml.pcie_bytes_per_second(dev.handle, tx=is_tx), None
            except NvmlError as err:
                return None, err

        results = list(self._executor().map(read, reads)) if reads else []
        for (dev, family, _), (value, err) in zip(reads, results, strict=True):
            got = scrape.read(dev, _reraise, value, err)
            if got is not None:
                family.add_metric(dev.labels, got)
        yield tx
        yield rx


def _build(ctx: BuildContext) -> PcieCollector:
    return PcieCollector(ctx.session, timer=ctx.timer, clock=ctx.clock)


register_collector(PcieCollector.name, default=False, factory=_build)  # opt-in: ~20 ms per direction per GPU
