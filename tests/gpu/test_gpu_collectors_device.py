from __future__ import annotations

from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.device import DeviceCollector
from exporters.gpu.nvml import NvmlError
from tests.gpu.helpers import MakeRig, Scraped, SimRig

MODEL = "NVIDIA H100 80GB HBM3"


def uuid(i: int) -> str:
    return f"GPU-5e1f0000-0000-4000-8000-{i:012x}"


def test_info_and_up(rig: SimRig, registry: CollectorRegistry) -> None:
    DeviceCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.series("loadlens_gpu_info") == {
        frozenset(
            {
                ("gpu", str(i)),
                ("uuid", uuid(i)),
                ("model", MODEL),
                ("pci_bus_id", f"00000000:1{i}:00.0"),
                ("driver_version", "550.54.15"),
                ("cuda_driver_version", "12.4"),
            }
        ): 1.0
        for i in (0, 1)
    }
    assert got.get("loadlens_gpu_device_up", {"gpu": "1", "uuid": uuid(1), "model": MODEL}) == 1
    assert got.get("loadlens_gpu_collector_success", {"collector": "device"}) == 1


def test_lost_gpu_keeps_identity_and_is_down(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="lost:1@1")
    DeviceCollector(rig.session, registry=registry)
    Scraped(registry)
    rig.clock.advance(1)
    dev1 = rig.session.devices()[1]
    try:
        rig.nvml.power_watts(dev1.handle)
    except NvmlError as err:
        rig.session.mark_lost(dev1, err)
    rig.clock.advance(5)  # re-initialisation happens and still finds it lost
    got = Scraped(registry)
    assert got.get("loadlens_gpu_device_up", {"gpu": "1", "uuid": uuid(1), "model": MODEL}) == 0
    assert got.get("loadlens_gpu_device_up", {"gpu": "0", "uuid": uuid(0), "model": MODEL}) == 1
    assert len(got.series("loadlens_gpu_info")) == 2
    assert got.get("loadlens_gpu_collector_success", {"collector": "device"}) == 1


def test_pci_unsupported_is_empty_label(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:pci")
    DeviceCollector(rig.session, registry=registry)
    infos = Scraped(registry).series("loadlens_gpu_info")
    assert all(("pci_bus_id", "") in labels for labels in infos)


def test_nvml_missing_fails_the_collector(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="init-fail:5")
    DeviceCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.series("loadlens_gpu_info") == {}
    assert got.get("loadlens_gpu_collector_success", {"collector": "device"}) == 0


def test_datasheet_peaks_come_from_the_packaged_profile(rig: SimRig, registry: CollectorRegistry) -> None:
    """The MFU and MBU denominators: the h100-sxm profile's figures for the device NVML names (the profile's
    marketing_name); a device no packaged profile names gets none (absent, not 0)."""
    from exporters.gpu.collectors.device import _profile
    from loadlens.contracts.gpu_profile import load_gpu_profile

    DeviceCollector(rig.session, registry=registry)
    got = Scraped(registry)
    h100 = load_gpu_profile("h100-sxm")
    for i in (0, 1):
        labels = {"gpu": str(i), "uuid": uuid(i), "model": MODEL}
        assert got.get("loadlens_gpu_peak_flops_per_second", labels) == h100.peak_tensor_flops == 989.5e12
        assert got.get("loadlens_gpu_peak_memory_bytes_per_second", labels) == h100.hbm_bytes_per_s == 3.35e12
    assert _profile("NVIDIA No Such GPU") is None
