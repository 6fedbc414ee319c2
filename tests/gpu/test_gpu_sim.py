"""The sim backend answers like pynvml: same names, NVML units, NVML exceptions, faults on demand."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pynvml
import pytest

from exporters.gpu.nvml import ErrorKind, Nvml, NvmlError
from exporters.gpu.sim import SimHandle, SimNvml
from exporters.gpu.sim_sources import FileSource, HttpSource, SourceError, StaticSource, open_source
from loadlens.contracts.device_state import DeviceState, UtilSample
from tests.gpu.helpers import FakeClock, MakeRig, SimRig, default_state
from tests.gpu.sim_example import EXAMPLE_NOW_US, GIB, MIB, example_state


def test_calls_before_init_are_uninitialized(rig: SimRig) -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        rig.sim.nvmlDeviceGetCount()


def test_identity_and_units(rig: SimRig) -> None:
    sim = rig.sim
    sim.nvmlInit()
    assert sim.nvmlDeviceGetCount() == 2
    h = sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceGetIndex(h) == 1
    assert sim.nvmlDeviceGetUUID(h) == "GPU-5e1f0000-0000-4000-8000-000000000001"
    assert sim.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    assert sim.nvmlSystemGetDriverVersion() == "550.54.15"
    assert sim.nvmlSystemGetCudaDriverVersion() == 12040
    # NVML units: mW, mJ, MHz, whole degrees.
    assert sim.nvmlDeviceGetPowerUsage(h) == 412_500
    assert sim.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) == 123_456_789
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1755
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == 2619
    assert sim.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    assert sim.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 61
    assert sim.nvmlDeviceGetCurrentClocksEventReasons(h) == 0x4  # sw_power_cap on odd GPUs
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_VIDEO)


def test_memory_info_v2_and_v1(rig: SimRig) -> None:
    rig.sim.nvmlInit()
    h = SimHandle(0)
    dev = rig.source.state.devices[0]
    v2 = rig.sim.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert (v2.total, v2.used, v2.reserved) == (80 * GIB, dev.memory_used_bytes, 512 * MIB)
    assert v2.free == 80 * GIB - dev.memory_used_bytes - 512 * MIB
    v1 = rig.sim.nvmlDeviceGetMemoryInfo(h)
    assert v1.used == dev.memory_used_bytes + 512 * MIB  # v1 counts the reservation as used
    assert v1.free == v2.free


def test_samples_since_timestamp_and_not_found(rig: SimRig) -> None:
    rig.sim.nvmlInit()
    h = SimHandle(0)
    value_type, samples = rig.sim.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert value_type == pynvml.NVML_VALUE_TYPE_DOUBLE
    assert len(samples) == 60
    assert samples[-1].timeStamp == EXAMPLE_NOW_US
    _, newer = rig.sim.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, EXAMPLE_NOW_US - 250_000)
    assert [s.timeStamp for s in newer] == [EXAMPLE_NOW_US - 200_000, EXAMPLE_NOW_US - 100_000, EXAMPLE_NOW_US]
    with pytest.raises(pynvml.NVMLError_NotFound):
        rig.sim.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, EXAMPLE_NOW_US)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        rig.sim.nvmlDeviceGetSamples(h, pynvml.NVML_MEMORY_UTILIZATION_SAMPLES, 0)


def test_samples_accumulate_across_documents(rig: SimRig) -> None:
    # The engine sends only samples newer than since_us; the backend keeps a ring buffer like the driver's.
    rig.sim.nvmlInit()
    state = rig.source.state
    dev = state.devices[0]
    newer = [UtilSample(timestamp_us=EXAMPLE_NOW_US + 100_000, gpu_percent=99.0)]
    rig.set_state(state.model_copy(update={"devices": [dev.model_copy(update={"util_samples": newer})]}))
    _, samples = rig.sim.nvmlDeviceGetSamples(SimHandle(0), pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert len(samples) == 61
    assert samples[-1].sampleValue.dVal == 99.0


def test_process_names_and_unknown_pid(rig: SimRig) -> None:
    rig.sim.nvmlInit()
    procs = rig.sim.nvmlDeviceGetComputeRunningProcesses(SimHandle(1))
    assert [p.pid for p in procs] == [11000, 11001, 11002]
    assert rig.sim.nvmlSystemGetProcessName(11001) == "python3 worker-1"
    with pytest.raises(pynvml.NVMLError_NotFound):
        rig.sim.nvmlSystemGetProcessName(4242)


def test_ecc_remap_pcie_are_not_in_the_document(rig: SimRig) -> None:
    rig.sim.nvmlInit()
    h = SimHandle(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        rig.sim.nvmlDeviceGetTotalEccErrors(h, 0, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        rig.sim.nvmlDeviceGetRemappedRows(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        rig.sim.nvmlDeviceGetPcieThroughput(h, 0)


def test_unreachable_document_is_driver_not_loaded(rig: SimRig) -> None:
    rig.source.fail = OSError("connection refused")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        rig.sim.nvmlInit()


def test_unknown_version_is_version_mismatch(make_rig: MakeRig) -> None:
    rig = make_rig(default_state().model_copy(update={"version": 99}))
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        rig.sim.nvmlInit()


def test_reads_version_1_2_and_3_documents(make_rig: MakeRig) -> None:
    # A version-1 document as its writers produced it: no gpm field (nor the later busy timeline) at all.
    v1 = default_state().model_dump(exclude={"devices": {"__all__": {"gpm", "busy", "busy_intervals"}}}) | {
        "version": 1
    }
    rig = make_rig(DeviceState.model_validate(v1))
    rig.sim.nvmlInit()
    assert rig.sim.nvmlGpmQueryDeviceSupport(SimHandle(0)).isSupportedDevice == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no busy timeline before version 3
        rig.sim.loadlensSimBusy(SimHandle(0))
    v2 = default_state().model_dump(exclude={"devices": {"__all__": {"busy", "busy_intervals"}}}) | {"version": 2}
    rig.set_state(DeviceState.model_validate(v2))
    assert rig.sim.nvmlGpmQueryDeviceSupport(SimHandle(0)).isSupportedDevice == 1
    rig.set_state(default_state())
    assert default_state().version == 3
    assert rig.sim.loadlensSimBusy(SimHandle(0)).period_seconds == 0.084
    later = make_rig(default_state().model_copy(update={"version": 4}))
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        later.sim.nvmlInit()


def test_shutdown_then_calls_fail(rig: SimRig) -> None:
    rig.sim.nvmlInit()
    rig.sim.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        rig.sim.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        rig.sim.nvmlShutdown()


def test_document_is_cached_for_max_age() -> None:
    clock = FakeClock()
    source = StaticSource(default_state())
    calls = []
    real_fetch = source.fetch

    def counting_fetch(since_us: int) -> DeviceState:
        calls.append(since_us)
        return real_fetch(since_us)

    source.fetch = counting_fetch  # type: ignore[method-assign]
    sim = SimNvml(source, max_age=0.1, clock=clock)
    sim.nvmlInit()
    for _ in range(5):
        sim.nvmlDeviceGetCount()
    assert len(calls) == 1
    clock.advance(0.1)
    sim.nvmlDeviceGetCount()
    assert len(calls) == 2
    # Second fetch asks only for samples newer than the oldest "newest sample" across GPUs.
    assert calls == [0, EXAMPLE_NOW_US]


# --- faults ---


def test_fault_lost_window(make_rig: MakeRig) -> None:
    rig = make_rig(faults="lost:1@5-20")
    rig.sim.nvmlInit()
    h = SimHandle(1)
    assert rig.sim.nvmlDeviceGetPowerUsage(h) == 412_500
    rig.clock.advance(5)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        rig.sim.nvmlDeviceGetPowerUsage(h)
    assert rig.sim.nvmlDeviceGetPowerUsage(SimHandle(0)) == 412_500  # the other GPU is fine
    rig.clock.advance(15)
    assert rig.sim.nvmlDeviceGetPowerUsage(h) == 412_500


def test_fault_unsupported_fields(make_rig: MakeRig) -> None:
    rig = make_rig(faults="unsupported:power:0,unsupported:memory-v2")
    rig.sim.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        rig.sim.nvmlDeviceGetPowerUsage(SimHandle(0))
    assert rig.sim.nvmlDeviceGetPowerUsage(SimHandle(1)) == 412_500
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        rig.sim.nvmlDeviceGetMemoryInfo(SimHandle(0), version=pynvml.nvmlMemory_v2)
    assert rig.sim.nvmlDeviceGetMemoryInfo(SimHandle(0)).total == 80 * GIB


def test_fault_init_fail_then_recover(make_rig: MakeRig) -> None:
    rig = make_rig(faults="init-fail:2")
    for _ in range(2):
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
            rig.sim.nvmlInit()
    rig.sim.nvmlInit()
    assert rig.sim.nvmlDeviceGetCount() == 2
    assert rig.sim.init_calls == 3


def test_fault_process_churn(make_rig: MakeRig) -> None:
    rig = make_rig(faults="process-churn:0")
    rig.sim.nvmlInit()
    first = [p.pid for p in rig.sim.nvmlDeviceGetComputeRunningProcesses(SimHandle(0))]
    second = [p.pid for p in rig.sim.nvmlDeviceGetComputeRunningProcesses(SimHandle(0))]
    assert first == [10000, 10001, 10002]
    assert second == [10000]
    # The last listed process exits before its name is asked for.
    with pytest.raises(pynvml.NVMLError_NotFound):
        rig.sim.nvmlSystemGetProcessName(10002)
    assert [p.pid for p in rig.sim.nvmlDeviceGetComputeRunningProcesses(SimHandle(1))] == [11000, 11001, 11002]


def test_fault_xid_events(make_rig: MakeRig) -> None:
    rig = make_rig(faults="xid:1:79@3")
    sim = rig.sim
    sim.nvmlInit()
    es = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(SimHandle(1), pynvml.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait(es, 0)
    rig.clock.advance(3)
    event = sim.nvmlEventSetWait(es, 0)
    assert (event.device, event.eventType, event.eventData) == (SimHandle(1), pynvml.nvmlEventTypeXidCriticalError, 79)
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait(es, 0)  # fired once
    sim.inject_xid(0, 13)  # GPU 0 is not registered on this set
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait(es, 0)
    sim.nvmlEventSetFree(es)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlEventSetWait(es, 0)


# --- sources ---


def test_file_source_rereads_on_change(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(example_state(1, 1).model_dump_json())
    source = open_source(str(path))
    assert isinstance(source, FileSource)
    first = source.fetch(0)
    assert source.fetch(0) is first  # unchanged file: no re-parse
    path.write_text(example_state(3, 1).model_dump_json())
    os.utime(path, ns=(1, 1))  # force a different mtime even on coarse filesystems
    assert len(source.fetch(0).devices) == 3


def test_file_source_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot read"):
        FileSource(tmp_path / "missing.json").fetch(0)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1}))
    with pytest.raises(SourceError, match="invalid device-state document at timestamp_us"):
        FileSource(bad).fetch(0)


class _EngineStub(BaseHTTPRequestHandler):
    """Serves /sim/device-state like the sim engine: only samples newer than since_us."""

    state: DeviceState
    seen: list[int]

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path != "/sim/device-state":
            self.send_error(404)
            return
        since = int(parse_qs(url.query).get("since_us", ["0"])[0])
        self.seen.append(since)
        devices = [
            d.model_copy(update={"util_samples": [s for s in d.util_samples if s.timestamp_us > since]})
            for d in self.state.devices
        ]
        body = self.state.model_copy(update={"devices": devices}).model_dump_json().encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def engine() -> Iterator[tuple[str, list[int]]]:
    seen: list[int] = []
    handler = type("Handler", (_EngineStub,), {"state": default_state(), "seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_http_source_sends_since_us(engine: tuple[str, list[int]]) -> None:
    base, seen = engine
    clock = FakeClock()
    source = open_source(f"{base}/sim/device-state")
    assert isinstance(source, HttpSource)
    sim = SimNvml(source, max_age=0.1, clock=clock)
    sim.nvmlInit()
    _, samples = sim.nvmlDeviceGetSamples(SimHandle(0), pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert len(samples) == 60
    clock.advance(1)
    assert sim.nvmlDeviceGetCount() == 2
    assert seen == [0, EXAMPLE_NOW_US]
    # Samples already held survive a response that carries none.
    _, samples = sim.nvmlDeviceGetSamples(SimHandle(0), pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert len(samples) == 60
    source.close()


def test_http_source_accepts_the_base_url(engine: tuple[str, list[int]]) -> None:
    base, _ = engine  # http://127.0.0.1:PORT: what a user types
    for given in (base, f"{base}/"):
        source = HttpSource(given)
        assert source.url == f"{base}/sim/device-state"
        assert len(source.fetch(0).devices) == 2
        source.close()


def test_http_source_errors(engine: tuple[str, list[int]]) -> None:
    base, _ = engine
    with pytest.raises(SourceError) as info:
        HttpSource(f"{base}/engine").fetch(0)  # a path that is not the document: the hint says which URL
    assert str(info.value) == (
        f"GET {base}/engine: HTTP 404 (the sim engine serves its document at /sim/device-state: try --sim-url "
        f"{base}/engine/sim/device-state)"
    )
    with pytest.raises(SourceError) as info:
        HttpSource(f"{base}/sim/device-state/").fetch(0)  # the right path, yet 404 (a proxy in between): no hint
    assert str(info.value) == f"GET {base}/sim/device-state/: HTTP 404"
    with pytest.raises(ValueError, match="https is not supported"):
        open_source("https://example.invalid/sim/device-state")
    with pytest.raises(ValueError, match="not an http:// URL"):
        HttpSource("ftp://x")


def test_http_source_unreachable() -> None:
    from loadlens.util.net import free_port

    # A port nobody listens on: free_port's picks are never another caller's, and lie below the ephemeral range
    # that a bind(port 0) elsewhere (another test's server) could be given right after this one closed it.
    port = free_port()
    source = HttpSource(f"http://127.0.0.1:{port}/sim/device-state", timeout=1.0)
    with pytest.raises(SourceError, match="GET http://127.0.0.1"):
        source.fetch(0)
    sim = SimNvml(source)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        sim.nvmlInit()
    # The exporter's NVML wrapper carries the cause into its error and so into its log line.
    with pytest.raises(NvmlError) as info:
        Nvml(SimNvml(source)).init()
    # Worded as the sim backend's failure, naming the URL it tried; never as an NVML driver failure.
    err = info.value
    prefix = f"sim backend: cannot read the device-state document: GET http://127.0.0.1:{port}/sim/device-state: "
    assert err.detail is not None and err.detail.startswith(prefix)
    assert str(err) == err.detail
    assert (err.name, err.from_backend, err.kind) == ("SimDocumentUnavailable", True, ErrorKind.LIFECYCLE)
    assert "NVML" not in str(err) and "DriverNotLoaded" not in str(err)
