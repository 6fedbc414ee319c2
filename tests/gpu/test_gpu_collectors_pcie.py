from __future__ import annotations

import contextlib
import threading
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


class SlowPcie(WithPcie):
    """Each read blocks (as in NVML's 20 ms sampling window) until ``reads`` reads are in flight at once, and
    records how many overlapped. Concurrent reads pass the barrier whatever the machine's load; reads issued
    one after another break it after ``BARRIER_TIMEOUT_S`` and leave ``max_active`` at 1."""

    BARRIER_TIMEOUT_S = 10.0  # only a failing run waits it out

    def __init__(self, sim: Any, reads: int) -> None:
        super().__init__(sim)
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(reads, timeout=self.BARRIER_TIMEOUT_S)
        self.active = 0
        self.max_active = 0
        self.calls = 0

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        with self.lock:
            self.active += 1
            self.calls += 1
            self.max_active = max(self.max_active, self.active)
        # Broken when not all were in flight together: max_active then says how many were.
        with contextlib.suppress(threading.BrokenBarrierError):
            self.barrier.wait()
        with self.lock:
            self.active -= 1
        return super().nvmlDeviceGetPcieThroughput(handle, counter)


def test_pcie_reads_of_every_gpu_and_direction_overlap(rig: SimRig, registry: CollectorRegistry) -> None:
    slow = SlowPcie(rig.sim, reads=4)  # 2 GPUs x 2 directions
    rig.nvml._api = slow
    PcieCollector(rig.session, registry=registry)
    got = Scraped(registry)
    gpus = len(got.series("loadlens_gpu_pcie_tx_bytes_per_second"))
    assert gpus == 2
    assert slow.calls == 2 * gpus
    # All four reads were in flight at once: a scrape waits one sampling window, not four.
    assert slow.max_active == 2 * gpus


class FailingPcie(WithPcie):
    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        raise pynvml.NVMLError_GpuIsLost()


def test_a_lost_gpu_in_a_concurrent_read_is_still_classified(rig: SimRig, registry: CollectorRegistry) -> None:
    rig.nvml._api = FailingPcie(rig.sim)
    PcieCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.series("loadlens_gpu_pcie_tx_bytes_per_second") == {}
    # A lost GPU is the device collector's news (device_up 0); the pcie collector still did its job.
    assert got.get("loadlens_gpu_collector_success", {"collector": "pcie"}) == 1
    assert {d.index for d in rig.session.devices()} == set()
