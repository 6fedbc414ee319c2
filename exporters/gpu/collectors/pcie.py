"""PCIe throughput (opt-in: each read samples the bus for ~20 ms per direction per GPU)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from prometheus_client.core import Metric

from exporters.gpu.collector import GpuCollector, Scrape, gauge


class PcieCollector(GpuCollector):
    """Source: nvmlDeviceGetPcieThroughput (KiB/s, NVML_PCIE_UTIL_TX_BYTES / RX_BYTES)."""

    name = "pcie"

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        nvml = self.session.nvml
        tx = gauge("pcie_tx_bytes_per_second", "PCIe transmit throughput over NVML's 20 ms sample.")
        rx = gauge("pcie_rx_bytes_per_second", "PCIe receive throughput over NVML's 20 ms sample.")
        for dev in scrape.devices():
            for family, is_tx in ((tx, True), (rx, False)):
                value = scrape.read(dev, partial(nvml.pcie_bytes_per_second, tx=is_tx), dev.handle)
                if value is not None:
                    family.add_metric(dev.labels, value)
        yield tx
        yield rx
