"""The facade over a real-pynvml-shaped API: unit conversion, fallbacks and error classification.

The fake returns pynvml's own ctypes structures, so attribute names and types are the real ones.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest

from exporters.gpu.nvml import ErrorKind, Nvml, NvmlError, error_name


def _raise(code: int) -> Any:
    raise pynvml.NVMLError(code)


class FakePynvml:
    """Just enough of pynvml, answering like a driver < 515 without memory info v2."""

    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self) -> None:
        self.memory_calls: list[int | None] = []
        self.pending_events: list[Any] = []

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"535.104.05"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12020

    def nvmlSystemGetProcessName(self, pid: int) -> bytes:
        return b"/usr/bin/python3"

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = b"00000000:3B:00.0"
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        self.memory_calls.append(version)
        if version:
            _raise(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        m = pynvml.c_nvmlMemory_t()
        m.total, m.free, m.used = 100, 30, 70
        return m

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = 87, 12
        return u

    def nvmlDeviceGetSamples(self, handle: Any, sampling_type: int, timeStamp: int) -> Any:
        assert sampling_type == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        if timeStamp >= 300:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        out = []
        for ts, v in ((300, 50), (100, 10), (200, 20)):  # the driver's buffer is not guaranteed sorted
            s = pynvml.c_nvmlSample_t()
            s.timeStamp = ts
            s.sampleValue.uiVal = v
            if ts > timeStamp:
                out.append(s)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return 245_310  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return 9_876_543  # mJ

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return 64

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for v, fid in zip(values, field_ids, strict=True):
            v.fieldId = fid
            v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if handle == "geforce" else 0
            v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            v.value.uiVal = 71
        return values

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[clock]

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        return 1980

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        assert counter == pynvml.NVML_VOLATILE_ECC
        return 3 if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return 2, 1, 1, 0

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        return 1000 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 2  # KiB/s

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        class P:
            def __init__(self, pid: int, used: int | None) -> None:
                self.pid, self.usedGpuMemory = pid, used

        return [P(10, 1 << 30), P(11, None)]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return 3

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        if not self.pending_events:
            _raise(pynvml.NVML_ERROR_TIMEOUT)
        return self.pending_events.pop(0)


@pytest.fixture
def fake() -> FakePynvml:
    return FakePynvml()


@pytest.fixture
def nvml(fake: FakePynvml) -> Nvml:
    return Nvml(fake)


def test_default_api_is_pynvml() -> None:
    assert Nvml().api is pynvml


def test_units_are_converted_at_the_source(nvml: Nvml) -> None:
    assert nvml.power_watts("h") == 245.31
    assert nvml.power_limit_watts("h") == 700.0
    assert nvml.energy_joules("h") == 9876.543
    assert nvml.temperature_celsius("h") == 64.0
    assert nvml.memory_temperature_celsius("h") == 71.0
    assert nvml.sm_clock_hz("h") == 1_980_000_000.0
    assert nvml.memory_clock_hz("h") == 2_619_000_000.0
    assert nvml.max_sm_clock_hz("h") == 1_980_000_000.0
    assert nvml.pcie_bytes_per_second("h", tx=True) == 1_024_000.0
    assert nvml.pcie_bytes_per_second("h", tx=False) == 2048.0
    assert nvml.utilization("h") == (0.87, 0.12)


def test_strings_are_decoded(nvml: Nvml) -> None:
    assert nvml.driver_version() == "535.104.05"
    assert nvml.cuda_driver_version() == "12.2"
    assert nvml.pci_bus_id("h") == "00000000:3B:00.0"
    assert nvml.process_name(10) == "/usr/bin/python3"


def test_memory_falls_back_to_v1_once(nvml: Nvml, fake: FakePynvml) -> None:
    m = nvml.memory("h")
    assert (m.total, m.used, m.free, m.reserved) == (100, 70, 30, None)
    nvml.memory("h")
    # v2 was tried once; the driver's answer (FunctionNotFound) is remembered.
    assert fake.memory_calls == [pynvml.nvmlMemory_v2, None, None]


def test_samples_are_sorted_ratios_and_not_found_is_empty(nvml: Nvml) -> None:
    assert nvml.util_samples("h", 0) == [(100, 0.1), (200, 0.2), (300, 0.5)]
    assert nvml.util_samples("h", 150) == [(200, 0.2), (300, 0.5)]
    assert nvml.util_samples("h", 300) == []


def test_processes_keep_wddm_none(nvml: Nvml) -> None:
    procs = nvml.processes("h")
    assert [(p.pid, p.used_bytes) for p in procs] == [(10, 1 << 30), (11, None)]


def test_field_value_error_is_per_field(nvml: Nvml) -> None:
    with pytest.raises(NvmlError) as info:
        nvml.memory_temperature_celsius("geforce")
    assert info.value.kind is ErrorKind.UNSUPPORTED


def test_ecc_and_remapped_rows(nvml: Nvml) -> None:
    assert nvml.ecc_errors("h", corrected=True) == 3
    assert nvml.ecc_errors("h", corrected=False) == 1
    rows = nvml.remapped_rows("h")
    assert (rows.correctable, rows.uncorrectable, rows.pending, rows.failed) == (2, 1, True, False)


def test_event_wait(nvml: Nvml, fake: FakePynvml) -> None:
    assert nvml.event_wait("set", 0) is None  # NVML's Timeout: nothing pending
    xid = pynvml.c_nvmlEventData_t()
    xid.eventType, xid.eventData = pynvml.nvmlEventTypeXidCriticalError, 79
    other = pynvml.c_nvmlEventData_t()
    other.eventType, other.eventData = pynvml.nvmlEventTypeSingleBitEccError, 1
    fake.pending_events = [other, xid]
    assert nvml.event_wait("set", 0) is None
    event = nvml.event_wait("set", 0)
    assert event is not None
    assert (event.gpu_index, event.xid) == (3, 79)


def test_sim_only_calls_are_not_supported_on_pynvml(nvml: Nvml) -> None:
    for call in (nvml.memory_by_owner, nvml.allocator_state):
        with pytest.raises(NvmlError) as info:
            call("h")
        assert info.value.kind is ErrorKind.UNSUPPORTED


def test_missing_library_is_a_lifecycle_error() -> None:
    class NoLibrary:
        def nvmlInit(self) -> None:
            _raise(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    with pytest.raises(NvmlError) as info:
        Nvml(NoLibrary()).init()
    err = info.value
    assert (err.code, err.name, err.call, err.kind) == (12, "LibraryNotFound", "nvmlInit", ErrorKind.LIFECYCLE)
    assert str(err) == "nvmlInit: LibraryNotFound (12)"
    assert isinstance(err.__cause__, pynvml.NVMLError)


@pytest.mark.parametrize(
    ("code", "name", "kind"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "NotSupported", ErrorKind.UNSUPPORTED),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NoPermission", ErrorKind.UNSUPPORTED),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, "FunctionNotFound", ErrorKind.UNSUPPORTED),
        (pynvml.NVML_ERROR_DEPRECATED, "Deprecated", ErrorKind.UNSUPPORTED),
        (pynvml.NVML_ERROR_NOT_FOUND, "NotFound", ErrorKind.NO_DATA),
        (pynvml.NVML_ERROR_NO_DATA, "NoData", ErrorKind.NO_DATA),
        (pynvml.NVML_ERROR_GPU_IS_LOST, "GpuIsLost", ErrorKind.DEVICE_LOST),
        (pynvml.NVML_ERROR_GPU_NOT_FOUND, "GpuNotFound", ErrorKind.DEVICE_LOST),
        (pynvml.NVML_ERROR_UNINITIALIZED, "Uninitialized", ErrorKind.LIFECYCLE),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "DriverNotLoaded", ErrorKind.LIFECYCLE),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "LibRmVersionMismatch", ErrorKind.LIFECYCLE),
        (pynvml.NVML_ERROR_TIMEOUT, "Timeout", ErrorKind.OTHER),
        (pynvml.NVML_ERROR_UNKNOWN, "Unknown", ErrorKind.OTHER),
        (12345, "Unknown", ErrorKind.OTHER),
    ],
)
def test_error_classification(code: int, name: str, kind: ErrorKind) -> None:
    err = NvmlError(code, "nvmlDeviceGetX")
    assert (err.name, err.kind) == (name, kind)
    assert error_name(code) == name


class _CountingMaxClock:
    def __init__(self) -> None:
        self.calls = 0
        self.fail = True

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        self.calls += 1
        if self.fail:
            raise pynvml.NVMLError_Unknown()
        return 1980 if handle == "a" else 1755


def test_max_sm_clock_is_read_once_per_handle_and_failures_are_not_remembered() -> None:
    api = _CountingMaxClock()
    nvml = Nvml(api)
    with pytest.raises(NvmlError):
        nvml.max_sm_clock_hz("a")
    api.fail = False
    assert [nvml.max_sm_clock_hz("a") for _ in range(3)] == [1_980_000_000.0] * 3
    assert nvml.max_sm_clock_hz("b") == 1_755_000_000.0
    assert api.calls == 3  # the failure, then one read per handle
    nvml.shutdown()
    nvml.init()
    assert nvml.max_sm_clock_hz("a") == 1_980_000_000.0
    assert api.calls == 4  # a new NVML session reads again


def test_max_sm_clock_cache_works_with_pynvml_handles() -> None:
    # pynvml's device handles are ctypes pointers, which cannot be hashed; the cache keys them by address.
    api = _CountingMaxClock()
    api.fail = False
    api.nvmlDeviceGetMaxClockInfo = lambda handle, clock: (setattr(api, "calls", api.calls + 1), 1410)[1]  # type: ignore[method-assign]
    nvml = Nvml(api)
    first, second = pynvml.c_nvmlDevice_t(), pynvml.c_nvmlDevice_t()
    ctypes.memmove(ctypes.addressof(first), ctypes.byref(ctypes.c_void_p(0x1000)), ctypes.sizeof(ctypes.c_void_p))
    ctypes.memmove(ctypes.addressof(second), ctypes.byref(ctypes.c_void_p(0x2000)), ctypes.sizeof(ctypes.c_void_p))
    for _ in range(3):
        assert nvml.max_sm_clock_hz(first) == 1_410_000_000.0
        assert nvml.max_sm_clock_hz(second) == 1_410_000_000.0
    assert api.calls == 2
