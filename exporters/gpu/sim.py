"""The ``sim`` backend: the simulated engine's device-state document behind pynvml's call surface.

:class:`SimNvml` implements the functions in :class:`exporters.gpu.nvml.NvmlApi` with pynvml's names,
argument order, units (mW, mJ, MHz, percent) and exceptions (``pynvml.NVMLError`` subclasses), so the
collectors run the same code as on a real GPU. Fault injection (:mod:`exporters.gpu.faults`) lives here.

Where the document comes from (:mod:`exporters.gpu.sim_sources`)::

    SimNvml(open_source("http://127.0.0.1:8000/sim/device-state"))  # the sim engine (GET ?since_us=N)
    SimNvml(open_source("/tmp/device-state.json"))                   # a file, re-read when it changes
    SimNvml(StaticSource(DeviceState(...)))                          # tests

Error mapping: the document cannot be fetched or parsed -> ``SimDocumentUnavailable``; an unknown document
``version`` -> ``SimDocumentVersion``. Both are NVML lifecycle errors to the exporter (it reports the backend
down and re-initialises later), raised as pynvml's DriverNotLoaded / LibRmVersionMismatch classes so that
code written against pynvml still classifies them, but named and worded as the sim backend's failure: their
``detail`` (the URL or file, and what came back) is the whole message. An index missing from the document ->
``GpuIsLost``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, NoReturn

import pynvml

from exporters.gpu.faults import Faults
from exporters.gpu.nvml import CLOCK_EVENT_BITS
from exporters.gpu.sim_gpm import SimGpm
from exporters.gpu.sim_sources import DocumentSource, SourceError
from loadlens.contracts.device_state import (
    READABLE_DEVICE_STATE_VERSIONS,
    AllocatorState,
    DeviceState,
    SimDevice,
)
from loadlens.contracts.probe_document import ProbeBusy

# Driver ring buffers hold a bounded number of samples; so does ours (per device).
SAMPLE_BUFFER = 8192  # > 60 s at the sim engine's 10 ms, so the first fetch keeps a full window
# NVML's "not available" instance id (no MIG).
_NOT_AVAILABLE_GI = 0xFFFFFFFF
# The simulated device supports every clock-event reason NVML defines.
_ALL_CLOCK_EVENT_REASONS = sum(CLOCK_EVENT_BITS.values())


# --- pynvml-shaped values ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimHandle:
    index: int


@dataclass(slots=True)
class _Value:
    dVal: float


@dataclass(slots=True)
class _Sample:
    timeStamp: int
    sampleValue: _Value


@dataclass(slots=True)
class _Memory:
    total: int
    free: int
    used: int
    reserved: int = 0
    version: int = 0


@dataclass(slots=True)
class _Utilization:
    gpu: float
    memory: float


class _Process(NamedTuple):
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = _NOT_AVAILABLE_GI
    computeInstanceId: int = _NOT_AVAILABLE_GI


@dataclass(slots=True)
class _PciInfo:
    busId: str


@dataclass(slots=True)
class _FieldValue:
    fieldId: int
    nvmlReturn: int
    valueType: int
    value: _Value


@dataclass(slots=True)
class _EventData:
    device: SimHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = _NOT_AVAILABLE_GI
    computeInstanceId: int = _NOT_AVAILABLE_GI


class _EventSet:
    def __init__(self) -> None:
        self.devices: set[int] = set()
        self.pending: deque[_EventData] = deque(maxlen=1024)
        self.freed = False


# Error names of the backend's own failures (not NVML's): the exporter's nvml_errors_total and /health show them.
SIM_DOCUMENT_UNAVAILABLE = "SimDocumentUnavailable"
SIM_DOCUMENT_VERSION = "SimDocumentVersion"


def _raise(code: int, detail: str | None = None, *, backend_error: str | None = None) -> NoReturn:
    err = pynvml.NVMLError(code)
    if detail is not None:
        err.detail = detail  # carried into NvmlError and the exporter's log line
    if backend_error is not None:
        err.backend_error = backend_error  # the backend failed, not NVML: NvmlError takes this name and wording
    raise err


class SimNvml(SimGpm):
    """pynvml's call surface over a device-state document, with fault injection.

    ``max_age`` bounds how stale the cached document may be before a call fetches it again (the sampler
    ticks at 10 Hz; scrapes between ticks reuse its fetch). ``clock`` is monotonic seconds (injectable).
    """

    def __init__(
        self,
        source: DocumentSource,
        *,
        faults: Faults | None = None,
        max_age: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.faults = faults or Faults()
        self._max_age = max_age
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.RLock()
        self._initialised = False
        self.init_calls = 0
        self._state: DeviceState | None = None
        self._fetched_at = -float("inf")
        self._devices: dict[int, SimDevice] = {}
        self._names: dict[int, str] = {}
        self._samples: dict[str, deque[tuple[int, float]]] = {}
        self._churn_calls: dict[int, int] = {}
        self._vanished: set[int] = set()
        self._event_sets: list[_EventSet] = []
        self._xids_fired = 0
        self._unsupported: dict[int, frozenset[str]] = {}

    # --- document handling ---

    def elapsed(self) -> float:
        """Seconds since this backend was created: the time base of fault specs."""
        return self._clock() - self._t0

    def _since_us(self) -> int:
        if not self._devices or any(not self._samples.get(d.uuid) for d in self._devices.values()):
            return 0
        return min(self._samples[d.uuid][-1][0] for d in self._devices.values())

    def _load(self) -> None:
        try:
            state = self.source.fetch(self._since_us())
        except SourceError as err:
            self._initialised = False
            _raise(
                pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                f"sim backend: cannot read the device-state document: {err}",
                backend_error=SIM_DOCUMENT_UNAVAILABLE,
            )
        if state.version not in READABLE_DEVICE_STATE_VERSIONS:
            self._initialised = False
            _raise(
                pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
                f"sim backend: device-state document version {state.version}; this exporter reads versions "
                f"{', '.join(map(str, sorted(READABLE_DEVICE_STATE_VERSIONS)))}",
                backend_error=SIM_DOCUMENT_VERSION,
            )
        self._fetched_at = self._clock()
        if state is self._state:
            return  # an unchanged file: nothing new to merge
        self._state = state
        self._devices = {d.index: d for d in state.devices}
        self._names = {p.pid: p.name for d in state.devices for p in d.processes}
        for d in state.devices:
            buf = self._samples.setdefault(d.uuid, deque(maxlen=SAMPLE_BUFFER))
            last = buf[-1][0] if buf else -1
            for s in d.util_samples:
                if s.timestamp_us > last:
                    buf.append((s.timestamp_us, s.gpu_percent))
                    last = s.timestamp_us

    def _current(self) -> DeviceState:
        state = self._state
        # Fast path without the lock: reading two attributes is atomic enough for a freshness check.
        if self._initialised and state is not None and self._clock() - self._fetched_at < self._max_age:
            return state
        with self._lock:
            if not self._initialised:
                _raise(pynvml.NVML_ERROR_UNINITIALIZED)
            if self._clock() - self._fetched_at >= self._max_age:
                self._load()
            if self._state is None:
                _raise(pynvml.NVML_ERROR_UNINITIALIZED)
            return self._state

    def _device(self, handle: SimHandle, call: str) -> SimDevice:
        self._current()
        index = handle.index
        if self.faults.lost and self.faults.is_lost(index, self.elapsed()):
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        dev = self._devices.get(index)
        if dev is None:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        if call in self._unsupported_for(index):
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return dev

    def _unsupported_for(self, index: int) -> frozenset[str]:
        calls = self._unsupported.get(index)
        if calls is None:
            calls = self._unsupported[index] = self.faults.unsupported_calls(index)
        return calls

    # --- lifecycle and system ---

    def nvmlInit(self) -> None:
        with self._lock:
            self.init_calls += 1
            if self.init_calls <= self.faults.init_failures:
                _raise(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
            self._initialised = True
            self._load()

    def nvmlShutdown(self) -> None:
        with self._lock:
            if not self._initialised:
                _raise(pynvml.NVML_ERROR_UNINITIALIZED)
            self._initialised = False
            self._fetched_at = -float("inf")
            for es in self._event_sets:
                es.freed = True
            self._event_sets.clear()

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._current().driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self._current().cuda_driver_version

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._current()
        if pid in self._vanished or pid not in self._names:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        return self._names[pid]

    # --- identity ---

    def nvmlDeviceGetCount(self) -> int:
        self._current()
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimHandle:
        self._current()
        if index not in self._devices:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimHandle(index)

    def nvmlDeviceGetIndex(self, handle: SimHandle) -> int:
        self._current()
        return handle.index

    def nvmlDeviceGetName(self, handle: SimHandle) -> str:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle: SimHandle) -> str:
        return self._device(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, handle: SimHandle) -> _PciInfo:
        dev = self._device(handle, "nvmlDeviceGetPciInfo")
        return _PciInfo(busId=f"00000000:{0x10 + dev.index:02X}:00.0")

    # --- memory and utilisation ---

    def nvmlDeviceGetMemoryInfo(self, handle: SimHandle, version: int | None = None) -> _Memory:
        dev = self._device(handle, "nvmlDeviceGetMemoryInfo")
        free = max(0, dev.memory_total_bytes - dev.memory_used_bytes - dev.memory_reserved_bytes)
        if version:
            if "nvmlDeviceGetMemoryInfo_v2" in self._unsupported_for(dev.index):
                _raise(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return _Memory(dev.memory_total_bytes, free, dev.memory_used_bytes, dev.memory_reserved_bytes, version)
        # v1 counts the driver reservation as used.
        return _Memory(dev.memory_total_bytes, free, dev.memory_used_bytes + dev.memory_reserved_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle: SimHandle) -> _Utilization:
        dev = self._device(handle, "nvmlDeviceGetUtilizationRates")
        return _Utilization(gpu=dev.util_gpu_percent, memory=dev.util_memory_percent)

    def nvmlDeviceGetSamples(self, handle: SimHandle, sampling_type: int, timeStamp: int) -> tuple[int, list[_Sample]]:
        dev = self._device(handle, "nvmlDeviceGetSamples")
        if sampling_type != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            buf = self._samples.get(dev.uuid)
            if not buf or buf[-1][0] <= timeStamp:
                _raise(pynvml.NVML_ERROR_NOT_FOUND)  # as NVML: nothing newer than timeStamp
            new: list[_Sample] = []
            for ts, v in reversed(buf):  # newest first: usually only a few are new
                if ts <= timeStamp:
                    break
                new.append(_Sample(ts, _Value(v)))
        new.reverse()
        return pynvml.NVML_VALUE_TYPE_DOUBLE, new

    def nvmlDeviceGetComputeRunningProcesses(self, handle: SimHandle) -> list[_Process]:
        dev = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        procs = list(dev.processes)
        if self.faults.churns(dev.index):
            with self._lock:
                n = self._churn_calls.get(dev.index, 0)
                self._churn_calls[dev.index] = n + 1
                if n % 2 == 1:
                    procs = procs[: len(procs) // 2]
                if procs:
                    # The last listed process exits before anyone asks for its name.
                    self._vanished.add(procs[-1].pid)
        return [_Process(p.pid, p.used_bytes) for p in procs]

    # --- power, thermal, clocks ---

    def nvmlDeviceGetPowerUsage(self, handle: SimHandle) -> int:
        return round(self._device(handle, "nvmlDeviceGetPowerUsage").power_watts * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: SimHandle) -> int:
        return round(self._device(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_watts * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimHandle) -> int:
        return round(self._device(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_joules * 1000)

    def nvmlDeviceGetTemperature(self, handle: SimHandle, sensor: int) -> int:
        dev = self._device(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return round(dev.temperature_gpu_celsius)  # NVML reports whole degrees

    def nvmlDeviceGetFieldValues(self, handle: SimHandle, fieldIds: Sequence[int]) -> list[_FieldValue]:
        dev = self._device(handle, "nvmlDeviceGetFieldValues")
        out = []
        for fid in fieldIds:
            if fid == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                value = float(round(dev.temperature_memory_celsius))
                out.append(_FieldValue(fid, 0, pynvml.NVML_VALUE_TYPE_DOUBLE, _Value(value)))
            else:
                out.append(_FieldValue(fid, pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_VALUE_TYPE_DOUBLE, _Value(0)))
        return out

    def nvmlDeviceGetClockInfo(self, handle: SimHandle, type: int) -> int:
        dev = self._device(handle, "nvmlDeviceGetClockInfo")
        if type == pynvml.NVML_CLOCK_SM:
            return round(dev.sm_clock_hz / 1e6)
        if type == pynvml.NVML_CLOCK_MEM:
            return round(dev.memory_clock_hz / 1e6)
        return _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMaxClockInfo(self, handle: SimHandle, type: int) -> int:
        dev = self._device(handle, "nvmlDeviceGetMaxClockInfo")
        if type != pynvml.NVML_CLOCK_SM:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return round(dev.max_sm_clock_hz / 1e6)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: SimHandle) -> int:
        dev = self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        mask = 0
        for reason in dev.clock_event_reasons:
            mask |= CLOCK_EVENT_BITS.get(reason, 0)  # unknown names are ignored, as unknown bits would be
        return mask

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: SimHandle) -> int:
        self._device(handle, "nvmlDeviceGetSupportedClocksEventReasons")
        return _ALL_CLOCK_EVENT_REASONS

    # --- not in the document: NotSupported, the way a GeForce or a vGPU answers ---

    def nvmlDeviceGetTotalEccErrors(self, handle: SimHandle, errorType: int, counterType: int) -> int:
        self._device(handle, "nvmlDeviceGetTotalEccErrors")
        return _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetRemappedRows(self, handle: SimHandle) -> tuple[int, int, int, int]:
        self._device(handle, "nvmlDeviceGetRemappedRows")
        return _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetPcieThroughput(self, handle: SimHandle, counter: int) -> int:
        self._device(handle, "nvmlDeviceGetPcieThroughput")
        return _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # --- XID events (only injected ones: the document has none) ---

    def nvmlEventSetCreate(self) -> _EventSet:
        self._current()
        es = _EventSet()
        with self._lock:
            self._event_sets.append(es)
        return es

    def nvmlDeviceRegisterEvents(self, handle: SimHandle, eventTypes: int, eventSet: _EventSet) -> None:
        self._device(handle, "nvmlDeviceRegisterEvents")
        if not eventTypes & pynvml.nvmlEventTypeXidCriticalError:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        eventSet.devices.add(handle.index)

    def inject_xid(self, index: int, xid: int) -> None:
        """Queue an XID critical-error event on every event set that watches GPU ``index``."""
        with self._lock:
            for es in self._event_sets:
                if index in es.devices:
                    es.pending.append(_EventData(SimHandle(index), pynvml.nvmlEventTypeXidCriticalError, xid))

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> _EventData:
        deadline = time.monotonic() + timeoutms / 1000.0
        while True:
            self._current()
            if eventSet.freed:
                _raise(pynvml.NVML_ERROR_UNINITIALIZED)
            with self._lock:
                due = [x for x in self.faults.xids[self._xids_fired :] if x.at <= self.elapsed()]
                self._xids_fired += len(due)
            for x in due:
                self.inject_xid(x.gpu, x.xid)
            if eventSet.pending:
                event = eventSet.pending.popleft()
                if self.faults.is_lost(event.device.index, self.elapsed()):
                    _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
                return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _raise(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(remaining, 0.01))

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        with self._lock:
            eventSet.freed = True
            if eventSet in self._event_sets:
                self._event_sets.remove(eventSet)

    # --- simulator-only state, reached through Nvml.memory_by_owner / allocator_state ---

    def loadlensSimMemoryByOwner(self, handle: SimHandle) -> dict[str, int]:
        return self._device(handle, "loadlensSimMemoryByOwner").memory_by_owner.model_dump()

    def loadlensSimAllocatorState(self, handle: SimHandle) -> AllocatorState:
        return self._device(handle, "loadlensSimAllocatorState").allocator

    def loadlensSimBusy(self, handle: SimHandle) -> ProbeBusy:
        """The busy timeline's figures from the sim's step schedule (document version 3)."""
        busy = self._device(handle, "loadlensSimBusy").busy
        if busy is None:  # an older sim: no timeline
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return busy
