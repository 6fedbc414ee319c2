"""Profiling counters without DCGM: NVML GPM (GPU Performance Monitoring, Hopper and newer).

A GPM metric is computed from two samples of the device's counters taken some time apart. Each sampling pass
takes one new sample per GPU and reports the metrics between it and the previous pass's sample, so the values
cover the time between passes (``--collect-interval``, 1 s by default) and nothing ever waits between two
samples. Two samples are kept per GPU and reused in turn. Unlike the other collectors this one keeps state
between runs (the previous sample), dropped when NVML re-initialises.

GPM's counters advance only about every 100 ms (measured on an H200): a pass less than
:data:`MIN_SAMPLE_INTERVAL` after the previous sample serves the previous values rather than a near-empty
interval. Absent, never 0: a GPU without GPM support, a metric whose own return code says not supported, and
the first pass (no earlier sample yet).

With ``--dcgm-compat`` the same values are also exported under dcgm-exporter's ``DCGM_FI_PROF_*`` names and
labels.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pynvml
from prometheus_client.core import GaugeMetricFamily, Metric

from exporters.gpu.collector import GpuCollector, Scrape, gauge
from exporters.gpu.collectors.dcgm import DCGM_LABELS
from exporters.gpu.nvml import ErrorKind, NvmlError
from exporters.gpu.registration import BuildContext, register_collector
from exporters.gpu.session import Device, Session

log = logging.getLogger(__name__)

MIN_SAMPLE_INTERVAL = 0.1
_MIB = 1024 * 1024


@dataclass(frozen=True)
class GpmSeries:
    metric_id: int  # NVML_GPM_METRIC_*
    name: str  # loadlens_gpu_<name>
    help: str
    percent: bool  # NVML reports percent (-> ratio 0-1); else MiB/s (-> bytes/s)
    dcgm_name: str

    def base(self, value: float) -> float:
        return value / 100.0 if self.percent else value * _MIB


GPM_SERIES: tuple[GpmSeries, ...] = (
    GpmSeries(
        pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
        "gpm_graphics_active_ratio",
        "Share of the interval any graphics or compute engine was busy (GPM GRAPHICS_UTIL, 0-1).",
        True,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    ),
    GpmSeries(
        pynvml.NVML_GPM_METRIC_SM_UTIL,
        "gpm_sm_active_ratio",
        "Share of SM cycles with at least one warp resident, averaged over SMs (GPM SM_UTIL, 0-1).",
        True,
        "DCGM_FI_PROF_SM_ACTIVE",
    ),
    GpmSeries(
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
        "gpm_sm_occupancy_ratio",
        "Resident warps over the SMs' maximum, averaged over the interval (GPM SM_OCCUPANCY, 0-1).",
        True,
        "DCGM_FI_PROF_SM_OCCUPANCY",
    ),
    GpmSeries(
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        "gpm_tensor_active_ratio",
        "Share of SM cycles a tensor pipe of any precision was busy (GPM ANY_TENSOR_UTIL, 0-1).",
        True,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ),
    GpmSeries(
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
        "gpm_dram_active_ratio",
        "DRAM bandwidth used over its theoretical maximum (GPM DRAM_BW_UTIL, 0-1).",
        True,
        "DCGM_FI_PROF_DRAM_ACTIVE",
    ),
    GpmSeries(
        pynvml.NVML_GPM_METRIC_FP16_UTIL,
        "gpm_fp16_active_ratio",
        "Share of SM cycles the non-tensor FP16 pipe was busy (GPM FP16_UTIL, 0-1).",
        True,
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    ),
    GpmSeries(
        pynvml.NVML_GPM_METRIC_FP32_UTIL,
        "gpm_fp32_active_ratio",
        "Share of SM cycles the non-tensor FP32 pipe was busy (GPM FP32_UTIL, 0-1).",
        True,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    ),
    GpmSeries(
        pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
        "gpm_pcie_tx_bytes_per_second",
        "PCIe bytes sent by the GPU per second over the interval (GPM PCIE_TX_PER_SEC).",
        False,
        "DCGM_FI_PROF_PCIE_TX_BYTES",
    ),
    GpmSeries(
        pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
        "gpm_pcie_rx_bytes_per_second",
        "PCIe bytes received by the GPU per second over the interval (GPM PCIE_RX_PER_SEC).",
        False,
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    ),
)
GPM_METRIC_IDS: tuple[int, ...] = tuple(s.metric_id for s in GPM_SERIES)

# Our help for the aliases (dcgm-exporter's units: ratios 0-1, PCIe in bytes per second).
_DCGM_HELP: dict[str, str] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active (from NVML GPM).",
    "DCGM_FI_PROF_SM_ACTIVE": "Ratio of cycles an SM has at least one warp assigned (from NVML GPM).",
    "DCGM_FI_PROF_SM_OCCUPANCY": "Ratio of resident warps to the maximum per SM (from NVML GPM).",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "Ratio of cycles a tensor pipe is active (from NVML GPM).",
    "DCGM_FI_PROF_DRAM_ACTIVE": "Ratio of DRAM bandwidth used to its maximum (from NVML GPM).",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "Ratio of cycles the FP16 pipe is active (from NVML GPM).",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "Ratio of cycles the FP32 pipe is active (from NVML GPM).",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "PCIe bytes transmitted per second (from NVML GPM).",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "PCIe bytes received per second (from NVML GPM).",
}


@dataclass
class _DeviceGpm:
    generation: int
    supported: bool | None = None  # None: not asked yet this generation
    samples: list[Any] = field(default_factory=list)  # two buffers from nvmlGpmSampleAlloc
    current: int = 0  # which buffer the next sample goes into
    taken_at: float | None = None  # when the other buffer was filled (monotonic s)
    values: dict[int, float] | None = None  # the last metrics, NVML units
    interval: float | None = None


class GpmCollector(GpuCollector):
    """Sources: nvmlGpmQueryDeviceSupport, nvmlGpmSampleAlloc, nvmlGpmSampleGet, nvmlGpmMetricsGet."""

    name = "gpm"

    def __init__(
        self,
        session: Session,
        *,
        dcgm_compat: bool = False,
        hostname: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        self._dcgm_compat = dcgm_compat
        self._hostname = socket.gethostname() if hostname is None else hostname
        self._monotonic = monotonic
        self._devices: dict[str, _DeviceGpm] = {}
        super().__init__(session, **kwargs)

    def _state(self, dev: Device) -> _DeviceGpm:
        st = self._devices.get(dev.uuid)
        generation = self.session.generation
        if st is None or st.generation != generation:
            if st is not None:
                self._free(st)
            st = self._devices[dev.uuid] = _DeviceGpm(generation)
        return st

    def _free(self, st: _DeviceGpm) -> None:
        for sample in st.samples:
            try:
                self.session.nvml.gpm_sample_free(sample)
            except NvmlError as err:  # NVML was re-initialised: nothing more to do for it
                log.debug("nvmlGpmSampleFree: %s", err)
        st.samples = []

    def _supported(self, dev: Device, st: _DeviceGpm, scrape: Scrape) -> bool:
        if st.supported is None:
            try:
                st.supported = self.session.nvml.gpm_supported(dev.handle)
            except NvmlError as err:
                if err.kind is not ErrorKind.UNSUPPORTED:
                    scrape.fail(dev, err)
                    return False
                st.supported = False  # a driver without GPM (FunctionNotFound) or a GPU before Hopper
            if not st.supported:
                log.debug("gpm: GPU %d: GPM not supported (series omitted)", dev.index)
        return st.supported

    def _sample(self, dev: Device, st: _DeviceGpm, scrape: Scrape) -> None:
        """Take this pass's sample and, with the previous one, the metrics between them."""
        nvml = self.session.nvml
        now = self._monotonic()
        if st.taken_at is not None and now - st.taken_at < MIN_SAMPLE_INTERVAL:
            return  # the counters have barely moved: keep serving the last values
        while len(st.samples) < 2:
            sample = scrape.read(dev, nvml.gpm_sample_alloc)
            if sample is None:
                return
            st.samples.append(sample)
        new, old = st.samples[st.current], st.samples[1 - st.current]
        if scrape.read(dev, nvml.gpm_sample_get, dev.handle, new) is None:
            st.values = None  # the series go absent rather than repeat a stale reading
            return
        if st.taken_at is not None:
            values = scrape.read(dev, nvml.gpm_metrics, old, new, GPM_METRIC_IDS)
            st.values, st.interval = values, now - st.taken_at
        st.taken_at = now
        st.current = 1 - st.current

    def _collect(self, scrape: Scrape) -> Iterable[Metric]:
        families = [gauge(s.name, s.help) for s in GPM_SERIES]
        interval = gauge("gpm_interval_seconds", "Time between the two GPM samples the gpm_* values cover.")
        dcgm = [GaugeMetricFamily(s.dcgm_name, _DCGM_HELP[s.dcgm_name], labels=DCGM_LABELS) for s in GPM_SERIES]
        for dev in scrape.devices():
            if scrape.skipped(dev):
                continue
            st = self._state(dev)
            if not self._supported(dev, st, scrape):
                continue
            self._sample(dev, st, scrape)
            if st.values is None or st.interval is None:
                continue
            interval.add_metric(dev.labels, st.interval)
            dcgm_labels = [str(dev.index), dev.uuid, dev.pci_bus_id, f"nvidia{dev.index}", dev.model, self._hostname]
            for series, family, alias in zip(GPM_SERIES, families, dcgm, strict=True):
                value = st.values.get(series.metric_id)
                if value is None:
                    continue  # this metric is not supported on this GPU
                family.add_metric(dev.labels, series.base(value))
                alias.add_metric(dcgm_labels, series.base(value))
        yield from families
        yield interval
        if self._dcgm_compat:
            yield from dcgm


def _build(ctx: BuildContext) -> GpmCollector:
    return GpmCollector(
        ctx.session,
        dcgm_compat=ctx.dcgm_compat,
        hostname=ctx.hostname,
        monotonic=ctx.monotonic,
        timer=ctx.timer,
        clock=ctx.clock,
    )


register_collector(GpmCollector.name, default=True, factory=_build)  # absent where GPM is unsupported
