"""NVML GPM on the sim backend: ``nvmlGpm*`` over the device-state document's cumulative counters.

The calls take and return pynvml's own structures (``c_nvmlGpmSample_t``, ``c_nvmlGpmMetricsGet_t``,
``c_nvmlGpmSupport_t``), so :class:`exporters.gpu.nvml.Nvml` drives both backends with the same code. A
sample is a snapshot of the counters; a metric is the change between two samples over the time between them,
as GPM computes it. A device whose document has no ``gpm`` (version 1) is not supported; a counter the
document leaves out reads as not supported in that metric's own return code.
"""

from __future__ import annotations

import ctypes
from typing import Any, NoReturn

import pynvml

from loadlens.contracts.device_state import GpmCounters, SimDevice

_MIB = 1024 * 1024

# NVML_GPM_METRIC_* id -> (counter in GpmCounters, scale from counter units per second to NVML's unit).
GPM_COUNTERS: dict[int, tuple[str, float]] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: ("graphics_active_seconds", 100.0),
    pynvml.NVML_GPM_METRIC_SM_UTIL: ("sm_active_seconds", 100.0),
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: ("sm_occupancy_seconds", 100.0),
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("tensor_active_seconds", 100.0),
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram_active_seconds", 100.0),
    pynvml.NVML_GPM_METRIC_FP16_UTIL: ("fp16_active_seconds", 100.0),
    pynvml.NVML_GPM_METRIC_FP32_UTIL: ("fp32_active_seconds", 100.0),
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("pcie_tx_bytes", 1.0 / _MIB),
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("pcie_rx_bytes", 1.0 / _MIB),
}


def _fail(code: int) -> NoReturn:
    raise pynvml.NVMLError(code)


def _address(sample: Any) -> int:
    try:
        return ctypes.cast(sample, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return 0


class SimGpm:
    """The ``nvmlGpm*`` half of :class:`exporters.gpu.sim.SimNvml` (a base class of it)."""

    def _device(self, handle: Any, call: str) -> SimDevice:
        raise NotImplementedError  # SimNvml's

    def _gpm_store(self) -> dict[int, tuple[Any, tuple[int, GpmCounters] | None]]:
        """Allocated samples by address: (the buffer it points at, (device index, counters) once taken)."""
        store: dict[int, tuple[Any, tuple[int, GpmCounters] | None]] | None = self.__dict__.get("_gpm_samples")
        if store is None:
            store = self.__dict__["_gpm_samples"] = {}
        return store

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        dev = self._device(device, "nvmlGpmQueryDeviceSupport")
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 0 if dev.gpm is None else 1
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        buf = ctypes.create_string_buffer(8)
        self._gpm_store()[ctypes.addressof(buf)] = (buf, None)
        return ctypes.cast(buf, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        if self._gpm_store().pop(_address(gpmSample), None) is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        dev = self._device(device, "nvmlGpmSampleGet")
        if dev.gpm is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        store, addr = self._gpm_store(), _address(gpmSample)
        if addr not in store:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        store[addr] = (store[addr][0], (dev.index, dev.gpm))
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        store = self._gpm_store()
        first = store.get(_address(metricsGet.sample1), (None, None))[1]
        second = store.get(_address(metricsGet.sample2), (None, None))[1]
        if first is None or second is None or first[0] != second[0]:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # a sample never taken, freed, or of another GPU
        c1, c2 = first[1], second[1]
        elapsed = c2.time_seconds - c1.time_seconds
        for i in range(int(metricsGet.numMetrics)):
            metric = metricsGet.metrics[i]
            counter, scale = GPM_COUNTERS.get(int(metric.metricId), ("", 0.0))
            v1, v2 = getattr(c1, counter, None), getattr(c2, counter, None)
            if v1 is None or v2 is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                metric.value = 0.0
                continue
            metric.nvmlReturn = pynvml.NVML_SUCCESS
            # No time between the samples: the counters did not advance (GPM reads 0 within its ~100 ms).
            metric.value = max(0.0, (v2 - v1) / elapsed * scale) if elapsed > 0 else 0.0
        return metricsGet
