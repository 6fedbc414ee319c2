from __future__ import annotations

from typing import Any

import pynvml
from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.pcie import PcieCollector
from tests.gpu.helpers import Scraped, SimRig

L0 = {"gpu": "0", "uuid": "GPU-5e1f0000-0000-4000-8000-000000000000", "model": "NVIDIA H100 80GB HBM3"}


class WithPcie:
    def __init__(self, sim: Any) -> None:
        self._sim = sim

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sim, name)

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        return 2_000 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 500  # KiB/s


def test_pcie_in_bytes_per_second(rig: SimRig, registry: CollectorRegistry) -> None:
    rig.nvml._api = WithPcie(rig.sim)
    PcieCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_pcie_tx_bytes_per_second", L0) == 2_048_000
    assert got.get("loadlens_gpu_pcie_rx_bytes_per_second", L0) == 512_000


def test_pcie_unsupported_in_sim(rig: SimRig, registry: CollectorRegistry) -> None:
    PcieCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.series("loadlens_gpu_pcie_tx_bytes_per_second") == {}
    assert got.get("loadlens_gpu_collector_success", {"collector": "pcie"}) == 1
