"""A typed facade over a pynvml-shaped API: the one place where NVML values become base units.

Both backends implement the same call surface - the real ``pynvml`` module and
:class:`exporters.gpu.sim.SimNvml` - and every collector goes through :class:`Nvml`, so collector code
is identical for real and simulated GPUs. Every NVML failure becomes an :class:`NvmlError` whose
:attr:`~NvmlError.kind` says what the exporter should do with it::

    nvml = Nvml()                      # real pynvml
    nvml = Nvml(SimNvml(source))       # simulated device-state document
    nvml.init()
    h = nvml.handle(0)
    nvml.memory(h).used                # bytes
    nvml.power_watts(h)                # W (NVML reports mW)
"""

from __future__ import annotations

import ctypes
import enum
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import pynvml

MIB = 1024 * 1024

# pynvml turns every NVML return code into a subclass of this; the sim backend raises the same classes.
NVMLError: type[Exception] = pynvml.NVMLError


class ErrorKind(enum.Enum):
    """What an NVML failure means for the exporter."""

    UNSUPPORTED = "unsupported"  # field absent on this device/driver: omit the series, log at debug
    NO_DATA = "no_data"  # nothing new since the last call (samples): not an error
    DEVICE_LOST = "device_lost"  # this GPU fell off the bus: mark it down, keep the others
    LIFECYCLE = "lifecycle"  # NVML itself is unusable: mark the exporter down, re-initialise later
    OTHER = "other"  # anything else: the collector reports failure for this scrape


_KIND_BY_CODE: dict[int, ErrorKind] = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: ErrorKind.UNSUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION: ErrorKind.UNSUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: ErrorKind.UNSUPPORTED,
    pynvml.NVML_ERROR_DEPRECATED: ErrorKind.UNSUPPORTED,
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: ErrorKind.UNSUPPORTED,
    pynvml.NVML_ERROR_NOT_FOUND: ErrorKind.NO_DATA,
    pynvml.NVML_ERROR_NO_DATA: ErrorKind.NO_DATA,
    pynvml.NVML_ERROR_GPU_IS_LOST: ErrorKind.DEVICE_LOST,
    pynvml.NVML_ERROR_GPU_NOT_FOUND: ErrorKind.DEVICE_LOST,
    pynvml.NVML_ERROR_RESET_REQUIRED: ErrorKind.DEVICE_LOST,
    pynvml.NVML_ERROR_UNINITIALIZED: ErrorKind.LIFECYCLE,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: ErrorKind.LIFECYCLE,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: ErrorKind.LIFECYCLE,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: ErrorKind.LIFECYCLE,
}


@functools.cache
def error_name(code: int) -> str:
    """NVML's name for a return code, e.g. 15 -> ``GpuIsLost`` (a bounded label value).

    Taken from pynvml's exception class rather than ``str(err)``, which calls into the library.
    """
    name = type(pynvml.NVMLError(code)).__name__
    return name.removeprefix("NVMLError_") if name != "NVMLError" else "Unknown"


def _handle_key(handle: Any) -> Any:
    """A dictionary key for a device handle: pynvml's are ctypes pointers (unhashable), keyed by address."""
    try:
        hash(handle)
        return handle
    except TypeError:
        pass
    try:
        return ("address", ctypes.cast(handle, ctypes.c_void_p).value)
    except (TypeError, ctypes.ArgumentError):
        return None


class NvmlError(Exception):
    """An NVML call failed. ``code`` is the NVML return code, ``call`` the NVML function.

    ``backend_error`` names a failure of the backend itself rather than of NVML (the sim backend's
    ``SimDocumentUnavailable``): it becomes :attr:`name`, :attr:`from_backend` is True and the message is the
    backend's ``detail`` alone, so it never reads as an NVML driver failure. ``code`` still says how the
    exporter treats it (:attr:`kind`).
    """

    def __init__(self, code: int, call: str, detail: str | None = None, *, backend_error: str | None = None) -> None:
        self.code = code
        self.call = call
        self.name = backend_error or error_name(code)
        self.kind = _KIND_BY_CODE.get(code, ErrorKind.OTHER)
        self.detail = detail  # the cause where the backend knows it (the sim backend's fetch); None from NVML
        self.from_backend = backend_error is not None
        if self.from_backend:
            super().__init__(detail or f"{call}: {self.name}")
        else:
            super().__init__(f"{call}: {self.name} ({code})" + (f": {detail}" if detail else ""))


# --- clock-event (throttle) reasons: bit -> label value, from nvml.h --------------------------------------

CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
CLOCK_EVENT_BITS: dict[str, int] = dict(CLOCK_EVENT_REASONS)


# --- typed results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    """Device memory in bytes. ``reserved`` is None when only memory info v1 is available."""

    total: int
    used: int
    free: int
    reserved: int | None


class ProcessMemory(NamedTuple):
    """A tuple, not a dataclass: hundreds are built per scrape."""

    pid: int
    used_bytes: int | None  # None under WDDM, where NVML cannot attribute memory


@dataclass(frozen=True, slots=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True, slots=True)
class XidEvent:
    gpu_index: int
    xid: int


class NvmlApi(Protocol):
    """The subset of pynvml the exporter calls (the sim backend implements exactly this).

    Only a documentation and type-checking aid: ``pynvml`` itself is untyped.
    """

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlSystemGetProcessName(self, pid: int) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetIndex(self, handle: Any) -> int: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetSamples(self, handle: Any, sampling_type: int, timeStamp: int) -> tuple[int, Sequence[Any]]: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[int]) -> Sequence[Any]: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None: ...
    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any: ...
    def nvmlEventSetFree(self, eventSet: Any) -> None: ...
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any: ...
    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleFree(self, gpmSample: Any) -> None: ...
    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any: ...
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any: ...


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# Which member of NVML's value union holds a sample, by nvmlValueType_t.
_VALUE_MEMBER: dict[int, str] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

# What a driver older than 515 answers for nvmlDeviceGetMemoryInfo_v2 (not NotSupported: that is per GPU).
_NO_MEMORY_V2 = frozenset({pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH})

# Field values report a per-field return code inside a successful call.
_NVML_SUCCESS = 0


class Nvml:
    """Typed, unit-converting wrapper. ``api`` defaults to the real ``pynvml`` module (R2 style)."""

    def __init__(self, api: Any = None) -> None:
        self._api: Any = pynvml if api is None else api
        self._memory_v2 = True  # cleared for good once the driver says it lacks memory info v2 (< 515)
        # Per-device constants, read once per handle: nvmlDeviceGetMaxClockInfo took 1.3 ms (p50) per call on
        # an H200 (benchmarks/gpu_nvml_check.py), on every scrape, for a value that never changes. Cleared by
        # init/shutdown, so a re-initialised NVML (new handles) is asked again.
        self._constants: dict[tuple[str, Any], Any] = {}

    @property
    def api(self) -> Any:
        return self._api

    def _call(self, name: str, *args: Any) -> Any:
        fn: Callable[..., Any] = getattr(self._api, name)
        try:
            return fn(*args)
        except NVMLError as err:
            code = int(getattr(err, "value", pynvml.NVML_ERROR_UNKNOWN))
            detail = getattr(err, "detail", None)
            backend_error = getattr(err, "backend_error", None)
            raise NvmlError(
                code,
                name,
                detail if isinstance(detail, str) else None,
                backend_error=backend_error if isinstance(backend_error, str) else None,
            ) from err

    def _extra(self, name: str, handle: Any) -> Any:
        """A sim-only call (no NVML equivalent): NotSupported where the backend lacks it."""
        if not hasattr(self._api, name):
            raise NvmlError(pynvml.NVML_ERROR_NOT_SUPPORTED, name)
        return self._call(name, handle)

    # --- lifecycle and system ---

    def init(self) -> None:
        self._call("nvmlInit")
        self._memory_v2 = True
        self._constants.clear()

    def shutdown(self) -> None:
        self._constants.clear()
        self._call("nvmlShutdown")

    def _constant(self, key: str, handle: Any, read: Callable[[], Any]) -> Any:
        """``read()`` once per device handle; a failure is not remembered (the next call asks again)."""
        slot = (key, _handle_key(handle))
        if slot[1] is None:
            return read()
        if slot not in self._constants:
            self._constants[slot] = read()
        return self._constants[slot]

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> str:
        """e.g. 12040 -> ``12.4`` (NVML encodes major * 1000 + minor * 10)."""
        v = int(self._call("nvmlSystemGetCudaDriverVersion"))
        return f"{v // 1000}.{(v % 1000) // 10}"

    def process_name(self, pid: int) -> str:
        return _text(self._call("nvmlSystemGetProcessName", pid))

    # --- identity ---

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def handle(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def index(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetIndex", handle))

    def name(self, handle: Any) -> str:
        return _text(self._call("nvmlDeviceGetName", handle))

    def uuid(self, handle: Any) -> str:
        return _text(self._call("nvmlDeviceGetUUID", handle))

    def pci_bus_id(self, handle: Any) -> str:
        return _text(self._call("nvmlDeviceGetPciInfo", handle).busId)

    # --- memory and utilisation ---

    def memory(self, handle: Any) -> MemoryInfo:
        """Memory info v2 (total, reserved, free, used); v1 on drivers < 515, where ``used`` includes reserved."""
        if self._memory_v2:
            try:
                m = self._call("nvmlDeviceGetMemoryInfo", handle, pynvml.nvmlMemory_v2)
                return MemoryInfo(total=int(m.total), used=int(m.used), free=int(m.free), reserved=int(m.reserved))
            except NvmlError as err:
                if err.code not in _NO_MEMORY_V2:
                    raise
                self._memory_v2 = False  # the driver (all GPUs) predates v2
        m = self._call("nvmlDeviceGetMemoryInfo", handle)
        return MemoryInfo(total=int(m.total), used=int(m.used), free=int(m.free), reserved=None)

    def utilization(self, handle: Any) -> tuple[float, float]:
        """(gpu, memory) busy ratios 0-1 over the driver's last sample period."""
        u = self._call("nvmlDeviceGetUtilizationRates", handle)
        return float(u.gpu) / 100.0, float(u.memory) / 100.0

    def util_samples(self, handle: Any, since_us: int) -> list[tuple[int, float]]:
        """GPU-utilisation samples newer than ``since_us``: (timestamp µs, ratio 0-1), oldest first.

        NVML answers NotFound when nothing is new; that is an empty list here.
        """
        try:
            value_type, samples = self._call(
                "nvmlDeviceGetSamples", handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since_us
            )
        except NvmlError as err:
            if err.kind is ErrorKind.NO_DATA:
                return []
            raise
        member = _VALUE_MEMBER.get(int(value_type), "uiVal")
        out = [(int(s.timeStamp), float(getattr(s.sampleValue, member)) / 100.0) for s in samples]
        out.sort(key=lambda item: item[0])
        return out

    def processes(self, handle: Any) -> list[ProcessMemory]:
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", handle)
        return [ProcessMemory(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in procs]

    # --- power, thermal, clocks ---

    def power_watts(self, handle: Any) -> float:
        return int(self._call("nvmlDeviceGetPowerUsage", handle)) / 1000.0

    def power_limit_watts(self, handle: Any) -> float:
        return int(self._call("nvmlDeviceGetEnforcedPowerLimit", handle)) / 1000.0

    def energy_joules(self, handle: Any) -> float:
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption", handle)) / 1000.0

    def temperature_celsius(self, handle: Any) -> float:
        return float(self._call("nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU))

    def memory_temperature_celsius(self, handle: Any) -> float:
        """HBM temperature through field values (NVML_FI_DEV_MEMORY_TEMP); absent on GeForce."""
        (field,) = self._call("nvmlDeviceGetFieldValues", handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
        if int(field.nvmlReturn) != _NVML_SUCCESS:
            raise NvmlError(int(field.nvmlReturn), "nvmlDeviceGetFieldValues")
        member = _VALUE_MEMBER.get(int(field.valueType), "uiVal")
        return float(getattr(field.value, member))

    def sm_clock_hz(self, handle: Any) -> float:
        return int(self._call("nvmlDeviceGetClockInfo", handle, pynvml.NVML_CLOCK_SM)) * 1e6

    def memory_clock_hz(self, handle: Any) -> float:
        return int(self._call("nvmlDeviceGetClockInfo", handle, pynvml.NVML_CLOCK_MEM)) * 1e6

    def max_sm_clock_hz(self, handle: Any) -> float:
        """The board's maximum SM clock: a constant, read once per handle."""
        read = lambda: int(self._call("nvmlDeviceGetMaxClockInfo", handle, pynvml.NVML_CLOCK_SM)) * 1e6  # noqa: E731
        return float(self._constant("max_sm_clock", handle, read))

    def clock_event_reasons(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetCurrentClocksEventReasons", handle))

    def supported_clock_event_reasons(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetSupportedClocksEventReasons", handle))

    # --- errors and PCIe ---

    def ecc_errors(self, handle: Any, *, corrected: bool) -> int:
        """Volatile (since driver load) ECC error count: monotonic until a reboot or driver reload."""
        kind = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED if corrected else pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return int(self._call("nvmlDeviceGetTotalEccErrors", handle, kind, pynvml.NVML_VOLATILE_ECC))

    def remapped_rows(self, handle: Any) -> RemappedRows:
        corr, unc, pending, failed = self._call("nvmlDeviceGetRemappedRows", handle)
        return RemappedRows(int(corr), int(unc), bool(pending), bool(failed))

    def pcie_bytes_per_second(self, handle: Any, *, tx: bool) -> float:
        """PCIe throughput; NVML samples 20 ms per call and reports KiB/s."""
        counter = pynvml.NVML_PCIE_UTIL_TX_BYTES if tx else pynvml.NVML_PCIE_UTIL_RX_BYTES
        return int(self._call("nvmlDeviceGetPcieThroughput", handle, counter)) * 1024.0

    # --- XID events ---

    def event_set_create(self) -> Any:
        return self._call("nvmlEventSetCreate")

    def register_xid_events(self, handle: Any, event_set: Any) -> None:
        self._call("nvmlDeviceRegisterEvents", handle, pynvml.nvmlEventTypeXidCriticalError, event_set)

    def event_wait(self, event_set: Any, timeout_ms: int) -> XidEvent | None:
        """One pending XID event, or None when none is waiting (NVML's Timeout)."""
        try:
            data = self._call("nvmlEventSetWait", event_set, timeout_ms)
        except NvmlError as err:
            if err.code == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise
        if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
            return None
        return XidEvent(gpu_index=self.index(data.device), xid=int(data.eventData))

    def event_set_free(self, event_set: Any) -> None:
        self._call("nvmlEventSetFree", event_set)

    # --- GPM profiling counters (Hopper and newer) ---

    def gpm_supported(self, handle: Any) -> bool:
        return bool(self._call("nvmlGpmQueryDeviceSupport", handle).isSupportedDevice)

    def gpm_sample_alloc(self) -> Any:
        return self._call("nvmlGpmSampleAlloc")

    def gpm_sample_free(self, sample: Any) -> None:
        self._call("nvmlGpmSampleFree", sample)

    def gpm_sample_get(self, handle: Any, sample: Any) -> Any:
        """Fills ``sample`` (from :meth:`gpm_sample_alloc`) with the device's counters now; returns it."""
        self._call("nvmlGpmSampleGet", handle, sample)
        return sample

    def gpm_metrics(self, sample1: Any, sample2: Any, metric_ids: Sequence[int]) -> dict[int, float]:
        """GPM metrics between two samples, by NVML_GPM_METRIC_* id, in NVML's units (percent, MiB/s). A metric
        whose own return code says not supported is left out; any other per-metric failure raises."""
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1 = sample1
        request.sample2 = sample2
        for i, metric_id in enumerate(metric_ids):
            request.metrics[i].metricId = metric_id
        got = self._call("nvmlGpmMetricsGet", request)
        out: dict[int, float] = {}
        for i in range(len(metric_ids)):
            m = got.metrics[i]
            code = int(m.nvmlReturn)
            if code == _NVML_SUCCESS:
                out[int(m.metricId)] = float(m.value)
            elif _KIND_BY_CODE.get(code, ErrorKind.OTHER) not in (ErrorKind.UNSUPPORTED, ErrorKind.NO_DATA):
                raise NvmlError(code, "nvmlGpmMetricsGet")
        return out

    # --- simulator-only state (NotSupported on real NVML) ---

    def memory_by_owner(self, handle: Any) -> dict[str, int]:
        return dict(self._extra("loadlensSimMemoryByOwner", handle))

    def allocator_state(self, handle: Any) -> Any:
        """The sim's caching-allocator model, an :class:`loadlens.contracts.device_state.AllocatorState`."""
        return self._extra("loadlensSimAllocatorState", handle)

    def sim_busy(self, handle: Any) -> Any:
        """The busy timeline's figures from the sim's step schedule, a
        :class:`loadlens.contracts.probe_document.ProbeBusy`."""
        return self._extra("loadlensSimBusy", handle)
