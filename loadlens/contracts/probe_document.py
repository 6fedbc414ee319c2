"""The per-process probe document: the contract between ``exporters.probe`` and the GPU exporter.

A probe inside each PyTorch process it is started in (with CUDA or without: a process without CUDA publishes
no devices, only its events) writes one of these, atomically, into a shared directory
(``LOADLENS_PROBE_DIR``); the GPU exporter's ``probe`` collector reads every one at each scrape
(docs/probe-documents.md). Units are base units (bytes, seconds, Unix seconds).

Versioning: ``version`` is bumped on any incompatible change; readers drop versions they do not know.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

PROBE_DOCUMENT_VERSION = 1
# A document whose written_at is older than this many intervals (plus the grace) is stale.
STALE_INTERVALS = 3.0
STALE_GRACE_SECONDS = 5.0
MAX_LORA_EVENTS = 32
MAX_DOCUMENT_BYTES = 1024 * 1024
# Roles are a label: a short slug keeps their number bounded and their values safe.
ROLE_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
FILE_PREFIX = "probe-"
FILE_SUFFIX = ".json"


def stale_after(interval_seconds: float) -> float:
    """Seconds after ``written_at`` from which a document is stale."""
    return STALE_INTERVALS * interval_seconds + STALE_GRACE_SECONDS


def valid_role(role: str) -> bool:
    return bool(ROLE_PATTERN.match(role))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolSegments(_Strict):
    """Segments of one pool and size class (``loadlens.contracts.allocator_math.SIZE_CLASSES``)."""

    pool: str = Field(pattern=r"^(small|large)$")
    size_class: str = Field(pattern=r"^(le_2mib|le_20mib|le_128mib|le_1gib|gt_1gib)$")
    segments: int = Field(ge=0)
    reserved_bytes: int = Field(ge=0)


class ProbeDevice(_Strict):
    """One CUDA device as this process's caching allocator sees it."""

    cuda_index: int = Field(ge=0, description="CUDA index in this process (differs from NVML's index)")
    uuid: str = Field(description="'GPU-...' from torch.cuda.get_device_properties(i).uuid; '' if unknown")
    name: str
    reserved_bytes: int = Field(ge=0)
    allocated_bytes: int = Field(ge=0)
    active_bytes: int = Field(ge=0)
    inactive_split_bytes: int = Field(ge=0)
    requested_bytes: int = Field(ge=0)
    rounding_overhead_bytes: int = Field(ge=0, description="allocated - requested, floored at 0")
    segments: int = Field(ge=0)
    alloc_retries: int = Field(ge=0)
    ooms: int = Field(ge=0)
    # From the last memory_snapshot(); None until one was taken.
    largest_free_block_bytes: int | None = Field(default=None, ge=0)
    total_free_bytes: int | None = Field(default=None, ge=0)
    fragmentation_ratio: float | None = Field(default=None, ge=0, le=1)
    pools: list[PoolSegments] = Field(default_factory=list)
    stats_at: float = Field(description="Unix time memory_stats() was read")
    snapshot_at: float | None = Field(default=None, description="Unix time of the snapshot the fields come from")


class LoraLoad(_Strict):
    adapter: str = Field(max_length=256)
    rank: int | None = Field(default=None, ge=0)
    start: float = Field(description="Unix time the load began")
    end: float = Field(description="Unix time the adapter was usable")
    on_demand: bool = Field(description="true when a request waited for it (not a preload)")
    source: Literal["storage", "cpu_cache"] = Field(
        default="storage",
        description="storage: the adapter was read (disk, hub); cpu_cache: vLLM moved it from its CPU cache into "
        "a GPU slot without a read",
    )


class ProbeEvents(_Strict):
    lora_loads: list[LoraLoad] = Field(default_factory=list, max_length=MAX_LORA_EVENTS, description="newest last")
    lora_loads_total: int = Field(default=0, ge=0)
    lora_on_demand_loads_total: int = Field(default=0, ge=0)
    lora_load_seconds_total: float = Field(default=0.0, ge=0)
    lora_on_demand_load_seconds_total: float = Field(default=0.0, ge=0)
    cuda_graph_capture_seconds: float | None = Field(default=None, ge=0, description="summed over captures")


class BusySpread(_Strict):
    """p50 / p95 / max (nearest rank) of busy-run or idle-gap lengths in the window, seconds."""

    p50: float = Field(ge=0)
    p95: float = Field(ge=0)
    max: float = Field(ge=0)


class ProbeBusy(_Strict):
    """The busy timeline's figures over the last ``window_seconds`` (loadlens.contracts.busy_math defines each)
    and its running totals; present only in a process where something records the timeline (an ``nn.Module``
    hook, vLLM's execute step)."""

    source: str = Field(max_length=64, description="what is timed: module_forward, vllm_execute_model")
    clock: Literal["cuda_event", "perf_counter", "sim_schedule"] = Field(
        description="cuda_event: device time from CUDA events; perf_counter: host time of a synchronous CPU step; "
        "sim_schedule: the sim's step schedule"
    )
    cuda_index: int | None = Field(default=None, ge=0, description="the timed CUDA device; null on the CPU")
    uuid: str = Field(default="", description="that device's 'GPU-...' UUID; '' on the CPU or if unknown")
    window_start: float = Field(description="Unix time the window begins")
    window_seconds: float = Field(gt=0)
    resolution_seconds: float = Field(gt=0, description="bin width of the series the period is found in")
    swing_bin_seconds: float = Field(gt=0, description="bin width of the series swing_ratio is taken over")
    busy_ratio: float = Field(ge=0, le=1, description="busy seconds / window seconds")
    swing_ratio: float | None = Field(default=None, ge=0, le=1, description="p95 - p5 of the binned busy ratio")
    period_seconds: float | None = Field(default=None, gt=0, description="dominant period (autocorrelation)")
    period_reason: str | None = Field(default=None, description="why period_seconds is null (busy_math codes)")
    busy_run: BusySpread | None = None
    idle_gap: BusySpread | None = None
    intervals_total: int = Field(ge=0, description="busy intervals recorded since the process started")
    busy_seconds_total: float = Field(ge=0, description="their summed length")
    dropped_total: int = Field(default=0, ge=0, description="CUDA event pairs dropped unresolved (queue full)")
    idle_gap_bounds: list[float] = Field(default_factory=list, description="histogram upper bounds, seconds")
    idle_gap_counts: list[int] = Field(
        default_factory=list, description="cumulative count of idle gaps <= each bound, since the start"
    )
    idle_gap_count: int = Field(default=0, ge=0, description="idle gaps since the start (the +Inf bucket)")
    idle_gap_sum: float = Field(default=0.0, ge=0, description="their summed length, seconds")


class ProbeDocument(_Strict):
    version: int = Field(description=f"document version; this is version {PROBE_DOCUMENT_VERSION}")
    pid: int = Field(ge=1, description="os.getpid() in the writer's own PID namespace")
    start_time_ticks: int | None = Field(
        default=None, ge=0, description="/proc/<pid>/stat starttime (clock ticks since boot); pid-reuse check"
    )
    pid_namespace: str | None = Field(default=None, description="readlink /proc/self/ns/pid, e.g. 'pid:[4026531836]'")
    role: str
    hostname: str = Field(max_length=255)
    written_at: float = Field(description="Unix time the document was written")
    interval_seconds: float = Field(gt=0, description="the probe's stats interval; staleness is derived from it")
    snapshot_interval_seconds: float | None = Field(
        default=None, gt=0, description="current interval between snapshots (backs off); null without CUDA"
    )
    snapshot_duration_seconds: float | None = Field(default=None, ge=0, description="cost of the last snapshot")
    stats_duration_seconds: float | None = Field(
        default=None, ge=0, description="cost of the last memory_stats() pass, all devices; null without CUDA"
    )
    torch_version: str = ""
    allocator_backend: str = Field(default="", description="torch.cuda.get_allocator_backend(), '' if unknown")
    allocator_config: dict[str, str] = Field(default_factory=dict, description="PYTORCH_ALLOC_CONF as key -> value")
    devices: list[ProbeDevice] = Field(default_factory=list)
    events: ProbeEvents = Field(default_factory=ProbeEvents)
    busy: ProbeBusy | None = Field(default=None, description="the busy timeline's figures; null: none recorded")

    @field_validator("role")
    @classmethod
    def _role(cls, value: str) -> str:
        if not valid_role(value):
            raise ValueError(f"role {value!r} must match {ROLE_PATTERN.pattern}")
        return value
