"""The simulated device-state document: the contract between the sim engine and the GPU exporter.

The sim engine serves it at ``GET /sim/device-state`` (see docs/device-state.md); the GPU exporter's
``sim`` backend reads it and presents it through the same call surface as pynvml. Units are base units
(bytes, watts, joules, hertz, seconds) except where NVML itself uses a percentage (utilisation, 0-100).

Versioning: ``version`` is bumped on every change of the schema; a reader lists the versions it reads
(:data:`READABLE_DEVICE_STATE_VERSIONS`) and rejects the others. Version 2 added ``SimDevice.gpm``; a
version-1 document (no ``gpm``) still parses and reads as GPM unsupported. Version 3 added
``SimDevice.busy_intervals`` and ``SimDevice.busy`` (the step schedule as a busy timeline); older documents
have none.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from loadlens.contracts.probe_document import ProbeBusy

DEVICE_STATE_VERSION = 3
# 1: before the GPM counters; 2: before the busy timeline
READABLE_DEVICE_STATE_VERSIONS: frozenset[int] = frozenset({1, 2, 3})
DEVICE_STATE_PATH = "/sim/device-state"  # where `loadlens serve --engine sim` serves the document


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class UtilSample(_Strict):
    """One utilisation sample, as NVML's nvmlDeviceGetSamples returns them."""

    timestamp_us: int = Field(description="CLOCK_REALTIME microseconds, like NVML's sample timestamps")
    gpu_percent: float = Field(ge=0, le=100, description="share of the sample period a kernel was running")


class MemoryByOwner(_Strict):
    """Who holds the device memory, in bytes. Sums to ``used_bytes`` of the device."""

    weights: int = Field(ge=0)
    kv_cache: int = Field(ge=0)
    activations: int = Field(ge=0)
    adapters: int = Field(ge=0)
    allocator_slack: int = Field(ge=0, description="reserved by the caching allocator but not allocated")
    other: int = Field(ge=0, description="CUDA context, cuBLAS workspaces, NCCL buffers")


class AllocatorState(_Strict):
    """The caching allocator, with the same fields as torch.cuda.memory_stats() (current values)."""

    reserved_bytes: int = Field(ge=0)
    allocated_bytes: int = Field(ge=0)
    active_bytes: int = Field(ge=0)
    inactive_split_bytes: int = Field(ge=0)
    requested_bytes: int = Field(ge=0, description="what callers asked for, before rounding to blocks")
    segments: int = Field(ge=0)
    alloc_retries: int = Field(ge=0, description="cumulative cudaMalloc retries after a cache flush")
    ooms: int = Field(ge=0, description="cumulative out-of-memory errors")
    largest_free_block_bytes: int = Field(ge=0)
    total_free_bytes: int = Field(ge=0, description="free bytes inside reserved segments")


class DeviceProcess(_Strict):
    pid: int = Field(ge=1)
    name: str
    used_bytes: int = Field(ge=0)


class GpmCounters(_Strict):
    """Cumulative profiling counters as NVML GPM samples them (Hopper and newer): GPM metrics are the change
    of these between two samples divided by the time between them. ``None``: the device models no such
    counter (the metric reads as not supported)."""

    time_seconds: float = Field(ge=0, description="time the counters cover, since the simulated device started")
    graphics_active_seconds: float = Field(ge=0, description="time any kernel ran (GPM GRAPHICS_UTIL)")
    sm_active_seconds: float = Field(ge=0, description="SM-time with at least one warp, per SM (GPM SM_UTIL)")
    sm_occupancy_seconds: float = Field(ge=0, description="resident warps / max warps, time-integrated")
    tensor_active_seconds: float = Field(ge=0, description="time the tensor pipes were busy (ANY_TENSOR_UTIL)")
    dram_active_seconds: float = Field(ge=0, description="time-integrated share of DRAM bandwidth (DRAM_BW_UTIL)")
    fp16_active_seconds: float | None = Field(default=None, ge=0, description="non-tensor FP16 pipe time")
    fp32_active_seconds: float | None = Field(default=None, ge=0, description="non-tensor FP32 pipe time")
    pcie_tx_bytes: int | None = Field(default=None, ge=0, description="bytes sent over PCIe")
    pcie_rx_bytes: int | None = Field(default=None, ge=0, description="bytes received over PCIe")


class BusyInterval(_Strict):
    """One step's kernel time on the simulated device (the engine's step schedule), CLOCK_REALTIME µs."""

    start_us: int
    end_us: int


class SimDevice(_Strict):
    index: int = Field(ge=0)
    uuid: str
    name: str = Field(description="marketing name, as nvmlDeviceGetName returns it")
    memory_total_bytes: int = Field(gt=0)
    memory_used_bytes: int = Field(ge=0)
    memory_reserved_bytes: int = Field(ge=0, description="driver/firmware reservation (memory info v2)")
    memory_by_owner: MemoryByOwner
    allocator: AllocatorState
    util_gpu_percent: float = Field(ge=0, le=100, description="instant utilisation (last sample period)")
    util_memory_percent: float = Field(ge=0, le=100)
    util_samples: list[UtilSample] = Field(description="samples newer than the request's `since_us`, oldest first")
    sample_interval_seconds: float = Field(gt=0, description="native interval between utilisation samples")
    power_watts: float = Field(ge=0)
    power_limit_watts: float = Field(gt=0)
    energy_joules: float = Field(ge=0, description="cumulative since the simulator started")
    temperature_gpu_celsius: float
    temperature_memory_celsius: float
    sm_clock_hz: float = Field(ge=0)
    memory_clock_hz: float = Field(ge=0)
    max_sm_clock_hz: float = Field(gt=0)
    clock_event_reasons: list[str] = Field(
        description="active clock-event (throttle) reasons, NVML names without prefix, e.g. 'sw_power_cap'"
    )
    processes: list[DeviceProcess]
    gpm: GpmCounters | None = Field(default=None, description="GPM counters (version 2); None: GPM not supported")
    busy_intervals: list[BusyInterval] = Field(
        default_factory=list,
        description="(version 3) the steps' kernel intervals ending after `since_us` and in the last 10 s, oldest "
        "first",
    )
    busy: ProbeBusy | None = Field(
        default=None, description="(version 3) the busy timeline's figures over the last 10 s, as a probe's"
    )


class DeviceState(_Strict):
    version: int = Field(description=f"document version; this is version {DEVICE_STATE_VERSION} (readers also read 1)")
    timestamp_us: int = Field(description="when the document was produced, CLOCK_REALTIME microseconds")
    driver_version: str
    cuda_driver_version: int = Field(description="as nvmlSystemGetCudaDriverVersion, e.g. 12040")
    devices: list[SimDevice]
