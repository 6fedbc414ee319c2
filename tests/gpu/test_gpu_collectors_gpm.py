"""The gpm collector: NVML GPM between two sampling passes, absent where unsupported, DCGM aliases."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest
from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.gpm import GPM_METRIC_IDS, GpmCollector
from exporters.gpu.nvml import Nvml
from exporters.gpu.server import GpuExporter
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource
from exporters.serving.engines.sim import load_gpu_profile
from exporters.serving.engines.sim.device import SM_OCCUPANCY_WHILE_BUSY, SimulatedGPU, device_state
from loadlens.contracts.device_state import DeviceState, GpmCounters
from tests.gpu.helpers import FakeClock, MakeRig, Scraped, SimRig, default_state

UUID0 = "GPU-5e1f0000-0000-4000-8000-000000000000"
L0 = {"gpu": "0", "uuid": UUID0, "model": "NVIDIA H100 80GB HBM3"}
DCGM0 = {
    "gpu": "0",
    "UUID": UUID0,
    "pci_bus_id": "00000000:10:00.0",
    "device": "nvidia0",
    "modelName": "NVIDIA H100 80GB HBM3",
    "hostname": "host-a",
}

# What nvmlGpmMetricsGet answered on the H200 during a bf16 matmul loop (issue 24), plus PCIe; FP16 answers
# NotSupported in its own return code, as a metric the device lacks does.
RECORDED: dict[int, float | None] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 99.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 96.6,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 14.3,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 93.8,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 16.1,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: None,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 0.5,
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 12.0,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 3.5,
}


def _ratio(metric_id: int) -> float:
    """The recorded percentage as the collector's ratio (NVML percent / 100)."""
    value = RECORDED[metric_id]
    assert value is not None
    return value / 100.0


class RecordedGpm:
    """pynvml's GPM call surface with its real structures (``c_nvmlGpmSample_t`` pointers, a
    ``c_nvmlGpmMetricsGet_t`` filled in place) and the recorded values; everything else from the sim."""

    def __init__(self, sim: Any, *, supported: bool = True, query_error: int | None = None) -> None:
        self._sim = sim
        self.supported = supported
        self.query_error = query_error
        self.buffers: dict[int, Any] = {}
        self.taken: list[int] = []  # sample addresses, in the order nvmlGpmSampleGet filled them
        self.requests: list[tuple[int, int, int, int, list[int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sim, name)

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        if self.query_error is not None:
            raise pynvml.NVMLError(self.query_error)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(self.supported)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        buf = ctypes.create_string_buffer(16)
        self.buffers[ctypes.addressof(buf)] = buf
        return ctypes.cast(buf, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        del self.buffers[ctypes.cast(gpmSample, ctypes.c_void_p).value or 0]

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        self.taken.append(ctypes.cast(gpmSample, ctypes.c_void_p).value or 0)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        n = int(metricsGet.numMetrics)
        addr = lambda p: ctypes.cast(p, ctypes.c_void_p).value or 0  # noqa: E731
        ids = [int(metricsGet.metrics[i].metricId) for i in range(n)]
        self.requests.append((int(metricsGet.version), n, addr(metricsGet.sample1), addr(metricsGet.sample2), ids))
        for i in range(n):
            value = RECORDED[ids[i]]
            metricsGet.metrics[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if value is None else 0
            metricsGet.metrics[i].value = 0.0 if value is None else value
        return metricsGet


def _recorded(rig: SimRig, **kwargs: Any) -> RecordedGpm:
    api = RecordedGpm(rig.sim, **kwargs)
    rig.nvml._api = api
    return api


def _collector(rig: SimRig, registry: CollectorRegistry, *, dcgm_compat: bool = False) -> GpmCollector:
    return GpmCollector(rig.session, registry=registry, dcgm_compat=dcgm_compat, hostname="host-a", monotonic=rig.clock)


def test_metrics_between_two_passes(rig: SimRig, registry: CollectorRegistry) -> None:
    api = _recorded(rig)
    _collector(rig, registry)
    first = Scraped(registry)  # one sample per GPU: nothing to compute yet
    assert first.series("loadlens_gpu_gpm_sm_active_ratio") == {}
    assert first.get("loadlens_gpu_collector_success", {"collector": "gpm"}) == 1
    rig.clock.advance(1.0)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_gpm_graphics_active_ratio", L0) == _ratio(pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL)
    assert got.get("loadlens_gpu_gpm_sm_active_ratio", L0) == _ratio(pynvml.NVML_GPM_METRIC_SM_UTIL)
    assert got.get("loadlens_gpu_gpm_sm_occupancy_ratio", L0) == _ratio(pynvml.NVML_GPM_METRIC_SM_OCCUPANCY)
    assert got.get("loadlens_gpu_gpm_tensor_active_ratio", L0) == _ratio(pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
    assert got.get("loadlens_gpu_gpm_dram_active_ratio", L0) == _ratio(pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
    assert got.get("loadlens_gpu_gpm_fp32_active_ratio", L0) == _ratio(pynvml.NVML_GPM_METRIC_FP32_UTIL)
    assert got.series("loadlens_gpu_gpm_fp16_active_ratio") == {}  # NotSupported in the metric: absent
    assert got.get("loadlens_gpu_gpm_pcie_tx_bytes_per_second", L0) == 12 * 1024 * 1024
    assert got.get("loadlens_gpu_gpm_pcie_rx_bytes_per_second", L0) == 3.5 * 1024 * 1024
    assert got.get("loadlens_gpu_gpm_interval_seconds", L0) == 1.0
    assert len(got.series("loadlens_gpu_gpm_sm_active_ratio")) == 2  # both GPUs
    assert not any(name.startswith("DCGM_FI_") for name in got.names)
    # Each GPU: the older sample first, the new one second, two buffers used in turn.
    version, n, s1, s2, ids = api.requests[0]
    assert (version, n, ids) == (pynvml.NVML_GPM_METRICS_GET_VERSION, len(GPM_METRIC_IDS), list(GPM_METRIC_IDS))
    assert (s1, s2) == (api.taken[0], api.taken[2])
    assert len(api.buffers) == 4 and s1 != s2


def test_buffers_alternate_and_no_sample_within_100ms(rig: SimRig, registry: CollectorRegistry) -> None:
    api = _recorded(rig)
    _collector(rig, registry)
    Scraped(registry)
    rig.clock.advance(1.0)
    Scraped(registry)
    rig.clock.advance(0.0625)  # GPM counters advance about every 100 ms: serve the last values, take nothing
    got = Scraped(registry)
    assert len(api.taken) == 4
    assert got.get("loadlens_gpu_gpm_sm_active_ratio", L0) == _ratio(pynvml.NVML_GPM_METRIC_SM_UTIL)
    rig.clock.advance(0.5)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_gpm_interval_seconds", L0) == 0.5625
    _, _, s1, s2, _ = api.requests[-2]  # GPU 0 of the third sampling: newest of before, then the reused buffer
    assert (s1, s2) == (api.taken[2], api.taken[4]) and s2 == api.taken[0]


def test_dcgm_aliases(rig: SimRig, registry: CollectorRegistry) -> None:
    _recorded(rig)
    _collector(rig, registry, dcgm_compat=True)
    Scraped(registry)
    rig.clock.advance(1.0)
    got = Scraped(registry)
    assert got.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE", DCGM0) == _ratio(pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL)
    assert got.get("DCGM_FI_PROF_SM_ACTIVE", DCGM0) == _ratio(pynvml.NVML_GPM_METRIC_SM_UTIL)
    assert got.get("DCGM_FI_PROF_SM_OCCUPANCY", DCGM0) == _ratio(pynvml.NVML_GPM_METRIC_SM_OCCUPANCY)
    assert got.get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", DCGM0) == _ratio(pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
    assert got.get("DCGM_FI_PROF_DRAM_ACTIVE", DCGM0) == _ratio(pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
    assert got.get("DCGM_FI_PROF_PIPE_FP32_ACTIVE", DCGM0) == _ratio(pynvml.NVML_GPM_METRIC_FP32_UTIL)
    assert got.series("DCGM_FI_PROF_PIPE_FP16_ACTIVE") == {}
    assert got.get("DCGM_FI_PROF_PCIE_TX_BYTES", DCGM0) == 12 * 1024 * 1024
    assert got.get("DCGM_FI_PROF_PCIE_RX_BYTES", DCGM0) == 3.5 * 1024 * 1024


def test_unsupported_device_has_no_series(rig: SimRig, registry: CollectorRegistry) -> None:
    api = _recorded(rig, supported=False)
    _collector(rig, registry, dcgm_compat=True)
    for _ in range(2):
        got = Scraped(registry)
        rig.clock.advance(1.0)
    assert [n for n in got.names if "gpm" in n or n.startswith("DCGM_FI_PROF")] != []  # families, no samples
    assert {k: v for k, v in got.values.items() if "gpm" in k[0] or k[0].startswith("DCGM_FI_PROF")} == {}
    assert got.get("loadlens_gpu_collector_success", {"collector": "gpm"}) == 1
    assert api.taken == [] and api.buffers == {}


def test_driver_without_gpm_has_no_series(rig: SimRig, registry: CollectorRegistry) -> None:
    _recorded(rig, query_error=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    _collector(rig, registry)
    Scraped(registry)
    rig.clock.advance(1.0)
    got = Scraped(registry)
    assert got.series("loadlens_gpu_gpm_sm_active_ratio") == {}
    assert got.get("loadlens_gpu_collector_success", {"collector": "gpm"}) == 1
    assert got.get("loadlens_gpu_nvml_errors_total", {"collector": "gpm", "error": "FunctionNotFound"}) is None


def _with_gpm(state: DeviceState, counters: GpmCounters | None) -> DeviceState:
    devices = [d.model_copy(update={"gpm": counters}) for d in state.devices]
    return state.model_copy(update={"devices": devices})


def _counters(t: float, busy: float) -> GpmCounters:
    return GpmCounters(
        time_seconds=t,
        graphics_active_seconds=busy,
        sm_active_seconds=busy,
        sm_occupancy_seconds=busy / 4,
        tensor_active_seconds=busy / 2,
        dram_active_seconds=busy / 8,
        pcie_tx_bytes=int(t * 1024 * 1024),
    )


def test_sim_backend_rates_from_counters(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(_with_gpm(default_state(), _counters(100.0, 40.0)))
    _collector(rig, registry)
    Scraped(registry)
    rig.set_state(_with_gpm(default_state(), _counters(102.0, 41.0)))  # 1 s busy in 2 s
    rig.clock.advance(1.0)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_gpm_sm_active_ratio", L0) == 0.5
    assert got.get("loadlens_gpu_gpm_graphics_active_ratio", L0) == 0.5
    assert got.get("loadlens_gpu_gpm_sm_occupancy_ratio", L0) == 0.125
    assert got.get("loadlens_gpu_gpm_tensor_active_ratio", L0) == 0.25
    assert got.get("loadlens_gpu_gpm_dram_active_ratio", L0) == 0.0625
    assert got.get("loadlens_gpu_gpm_pcie_tx_bytes_per_second", L0) == 1024 * 1024
    # Not in the document: not supported, so absent (never 0).
    assert got.series("loadlens_gpu_gpm_fp16_active_ratio") == {}
    assert got.series("loadlens_gpu_gpm_pcie_rx_bytes_per_second") == {}


def test_sim_backend_version_1_document_is_unsupported(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    state = _with_gpm(default_state(), None).model_copy(update={"version": 1})
    rig = make_rig(state)
    _collector(rig, registry)
    Scraped(registry)
    rig.clock.advance(1.0)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_nvml_up") is None  # a standalone collector: no session series
    assert got.series("loadlens_gpu_gpm_sm_active_ratio") == {}
    assert got.get("loadlens_gpu_collector_success", {"collector": "gpm"}) == 1


def test_sim_fault_makes_gpm_unsupported(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:gpm:0")
    _collector(rig, registry)
    Scraped(registry)
    rig.clock.advance(1.0)
    got = Scraped(registry)
    assert set(got.series("loadlens_gpu_gpm_sm_active_ratio")) == {
        frozenset({**L0, "gpu": "1", "uuid": UUID0[:-1] + "1"}.items())
    }


def _simulated(busy: bool) -> tuple[DeviceState, DeviceState]:
    """Two documents of the engine's simulated GPU 1 s apart; ``busy``: kernels ran all of that second."""
    clock = FakeClock(0.0)
    gpu = SimulatedGPU(load_gpu_profile("h100-sxm"), clock=clock, realtime=lambda: 1_700_000_000.0)
    clock.advance(1.0)
    before = DeviceState.model_validate(device_state([gpu]))
    if busy:
        gpu.record_busy(1.0, 2.0, memory_fraction=0.25, intensity=1.0, tensor_fraction=0.75)
    clock.advance(1.0)
    after = DeviceState.model_validate(device_state([gpu]))
    return before, after


def test_sim_engine_busy_and_idle(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    for busy, sm, tensor, dram, occupancy in ((True, 1.0, 0.75, 0.25, SM_OCCUPANCY_WHILE_BUSY), (False, 0, 0, 0, 0)):
        before, after = _simulated(busy)
        rig = make_rig(before)
        reg = CollectorRegistry()
        _collector(rig, reg)
        Scraped(reg)
        rig.set_state(after)
        rig.clock.advance(1.0)
        got = Scraped(reg)
        dev = after.devices[0]
        labels = {"gpu": "0", "uuid": dev.uuid, "model": dev.name}
        assert dev.gpm is not None and dev.gpm.time_seconds - before.devices[0].gpm.time_seconds == 1.0  # type: ignore[union-attr]
        # The counters are sums over 100 periods of 10 ms: equal up to the rounding of those sums.
        assert got.get("loadlens_gpu_gpm_sm_active_ratio", labels) == pytest.approx(sm, rel=1e-12, abs=0)
        assert got.get("loadlens_gpu_gpm_tensor_active_ratio", labels) == pytest.approx(tensor, rel=1e-12, abs=0)
        assert got.get("loadlens_gpu_gpm_dram_active_ratio", labels) == pytest.approx(dram, rel=1e-12, abs=0)
        assert got.get("loadlens_gpu_gpm_sm_occupancy_ratio", labels) == pytest.approx(occupancy, rel=1e-12, abs=0)
        assert got.series("loadlens_gpu_gpm_fp16_active_ratio") == {}  # the sim models no FP16 pipe


def test_exporter_serves_gpm_from_the_sampler_pass() -> None:
    clock = FakeClock()
    source = StaticSource(_with_gpm(default_state(), _counters(100.0, 40.0)))
    exporter = GpuExporter(
        Nvml(SimNvml(source, max_age=0.0, clock=clock)),
        backend="sim",
        collectors=["gpm", "dcgm"],
        proc_root=None,
        hostname="host-a",
        monotonic=clock,
    )
    exporter.sample_now()
    source.state = _with_gpm(default_state(), _counters(101.0, 40.25))
    clock.advance(1.0)
    exporter.sample_now()
    text = exporter.scrape().decode()
    assert f'loadlens_gpu_gpm_sm_active_ratio{{gpu="0",uuid="{UUID0}",model="NVIDIA H100 80GB HBM3"}} 0.25' in text
    assert 'DCGM_FI_PROF_SM_ACTIVE{gpu="0",' in text
