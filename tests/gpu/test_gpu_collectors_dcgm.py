from __future__ import annotations

from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.dcgm import DcgmCompatCollector
from tests.gpu.helpers import Scraped, SimRig

DCGM0 = {
    "gpu": "0",
    "UUID": "GPU-5e1f0000-0000-4000-8000-000000000000",
    "pci_bus_id": "00000000:10:00.0",
    "device": "nvidia0",
    "modelName": "NVIDIA H100 80GB HBM3",
    "hostname": "node-a",
}


def test_dcgm_names_units_and_labels(rig: SimRig, registry: CollectorRegistry) -> None:
    DcgmCompatCollector(rig.session, hostname="node-a", registry=registry)
    got = Scraped(registry)
    dev = rig.source.state.devices[0]
    assert got.get("DCGM_FI_DEV_GPU_UTIL", DCGM0) == 62.0  # percent
    assert got.get("DCGM_FI_DEV_FB_USED", DCGM0) == dev.memory_used_bytes // 2**20  # whole MiB
    free = dev.memory_total_bytes - dev.memory_used_bytes - dev.memory_reserved_bytes
    assert got.get("DCGM_FI_DEV_FB_FREE", DCGM0) == free // 2**20
    assert got.get("DCGM_FI_DEV_POWER_USAGE", DCGM0) == 412.5  # W
    assert got.get("DCGM_FI_DEV_GPU_TEMP", DCGM0) == 61.0  # C
    assert got.get("DCGM_FI_DEV_SM_CLOCK", DCGM0) == 1755.0  # MHz
    assert got.get("loadlens_gpu_collector_success", {"collector": "dcgm"}) == 1
