"""The simulated GPU behind the sim engine: utilisation samples, memory by owner, the caching allocator,
power, energy, temperature and clocks, published as the :class:`DeviceState` document.

- Utilisation is NVML's definition: the share of each sample period (10 ms) during which a kernel ran. The
  engine reports each step's kernel interval (the step minus its host overhead); batching-window waits, idle
  time and adapter loads (a synchronisation stall of the compute stream) count as not busy.
- Memory: weights and the whole KV cache are allocated at start-up (vLLM preallocates the cache, so NVML's
  "used" stays flat whatever the load); activations are reserved at their profiled peak and allocated per step;
  each LoRA module (A and B of one target module in one layer) is one allocation rounded up to 2 MiB, the
  guide-2.2 behaviour (about 1.2 MB asked, 2 MB taken). Evicted adapters' blocks stay cached in the allocator
  and are reused by later loads of the same size, so VRAM grows in steps and plateaus.
- Power: idle + (full-load − idle) × Σ(busy × intensity) / period, where intensity runs from 0.55 for
  memory-bound steps to 1.0 for compute-bound ones. Demand above the limit is capped and lowers the SM clock
  (``sw_power_cap``). Temperature follows power with a first-order lag; above the slowdown threshold the clock
  drops 15 % (``sw_thermal_slowdown``). Neither clock reduction feeds back into step times (documented gap).
- GPM profiling counters (document version 2), cumulative per finalised period: graphics and SM activity
  count the kernel time (every SM is taken to hold a warp while a kernel runs), tensor-pipe activity its
  compute share (the step's roofline compute time over its busy time), DRAM activity its memory share, and
  SM occupancy the kernel time times a fixed :data:`SM_OCCUPANCY_WHILE_BUSY`. FP16/FP32 non-tensor pipes and
  PCIe bytes are not modelled: the document leaves them out, so they read as not supported.
- Time: samples are computed lazily when the document is read or a step is recorded, from intervals on the
  monotonic clock; timestamps are CLOCK_REALTIME microseconds at the end of each period. The ring holds 60 s.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import random
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporters.serving.engines.sim.profile import GPUProfile
from loadlens.contracts.device_state import (
    DEVICE_STATE_VERSION,
    AllocatorState,
    BusyInterval,
    DeviceProcess,
    DeviceState,
    GpmCounters,
    MemoryByOwner,
    SimDevice,
    UtilSample,
)
from loadlens.contracts.probe_document import ProbeBusy
from loadlens.util.busy_report import WINDOW_S, BusyReport

SAMPLE_INTERVAL_SECONDS = 0.01
RING_SAMPLES = 6000
ALLOC_ROUND_BYTES = 2 << 20
"""The caching allocator's 2 MiB rounding that guide 2.2 measured for LoRA modules."""
POWER_SMOOTHING_SECONDS = 0.25
"""NVML's power reading is a short moving average, not the instantaneous draw."""
MEMORY_BOUND_INTENSITY = 0.55
THERMAL_SLOWDOWN_CLOCK = 0.85
SM_OCCUPANCY_WHILE_BUSY = 0.25
"""Resident warps over the maximum while a kernel runs (an assumption: the H200 read 14 % in a bf16 matmul)."""
with contextlib.suppress(ImportError):  # the busy figures' FFT: imported at start-up, not in the first request
    import numpy  # noqa: F401

BUSY_RING = 65_536
"""Step intervals kept for the busy timeline (the document carries those of the last ``WINDOW_S``)."""
BUSY_REFRESH_SECONDS = 1.0
"""The busy figures are recomputed at most this often (a few ms of the event loop's time each, on 10 s of 1 ms
bins); between two, a document carries the last ones."""
DRIVER_VERSION = "550.54.15"
CUDA_DRIVER_VERSION = 12040


def round_alloc(nbytes: int) -> int:
    return -(-nbytes // ALLOC_ROUND_BYTES) * ALLOC_ROUND_BYTES


@dataclass(slots=True)
class _Adapter:
    blocks: list[int]
    requested: int


class StepTimeline:
    """The steps' kernel intervals as a busy timeline (loadlens.util.busy_report.Timeline), Unix seconds: the
    engine's schedule, so nothing is pending and nothing is dropped."""

    source = "sim_step"
    clock = "sim_schedule"
    cuda_index: int | None = None
    dropped_total = 0
    pending = 0

    def __init__(self) -> None:
        self.ring: deque[tuple[float, float]] = deque(maxlen=BUSY_RING)
        self.recorded_total = 0
        self.busy_seconds_total = 0.0

    def add(self, start: float, end: float, seconds: float) -> None:
        """One step's kernels, Unix seconds; ``seconds`` their length on the monotonic clock (exact, where the
        difference of two Unix times near 1.7e9 keeps only about 0.2 µs)."""
        self.ring.append((start, end))
        self.recorded_total += 1
        self.busy_seconds_total += seconds

    def intervals(self, since: float = -math.inf) -> list[tuple[float, float]]:
        return [iv for iv in self.ring if iv[1] > since]


class SimulatedGPU:
    """One simulated GPU. All ``start``/``end`` arguments are ``time.monotonic()`` seconds."""

    def __init__(
        self,
        gpu: GPUProfile,
        *,
        index: int = 0,
        seed: int = 0,
        sample_interval: float = SAMPLE_INTERVAL_SECONDS,
        ring: int = RING_SAMPLES,
        clock: Callable[[], float] = time.monotonic,
        realtime: Callable[[], float] = time.time,
    ) -> None:
        self.gpu = gpu
        self.index = index
        self.uuid = "GPU-" + str(uuid.UUID(int=random.Random(f"{seed}:{gpu.name}:{index}").getrandbits(128), version=4))
        self._clock = clock
        self._period = sample_interval
        self._origin = clock()
        self._real_origin = realtime()
        self._next = 0
        """Index of the next sample period to finalise."""
        self._busy: dict[int, float] = {}
        self._mem_busy: dict[int, float] = {}
        self._heat: dict[int, float] = {}
        self._tensor: dict[int, float] = {}
        self._gpm_busy = 0.0  # cumulative seconds over finalised periods: kernels, tensor pipes, DRAM
        self._gpm_tensor = 0.0
        self._gpm_dram = 0.0
        self._samples: deque[tuple[int, float]] = deque(maxlen=ring)
        self._util = 0.0
        self._mem_util = 0.0
        self._demand = gpu.power_idle_watts
        self._power = gpu.power_idle_watts
        self._energy = 0.0
        self._temp = gpu.thermal.ambient_celsius + gpu.thermal.thermal_resistance_c_per_w * gpu.power_idle_watts
        self._clock_hz = gpu.idle_sm_clock_hz
        self._reasons: list[str] = ["gpu_idle"]
        # Memory, bytes.
        self.weights = 0
        self.kv_cache = 0
        self.activation_peak = 0
        self.activation_now = 0
        self._weight_segments = 0
        self._kv_segments = 0
        self._adapters: dict[str, _Adapter] = {}
        self._free_blocks: list[int] = []
        self.alloc_retries = 0
        self.ooms = 0
        self.timeline = StepTimeline()
        self._busy_report = BusyReport(self.timeline, uuid=self.uuid)
        self._busy_cache: tuple[float, ProbeBusy] | None = None  # (monotonic time computed, figures)

    # --- memory --------------------------------------------------------------------------------------------

    def configure_memory(
        self, *, weights: int, kv_cache: int, activation_peak: int, weight_segments: int, kv_segments: int
    ) -> None:
        self.weights = weights
        self.kv_cache = kv_cache
        # The caching allocator keeps what it once reserved: the activation pool never shrinks.
        self.activation_peak = max(self.activation_peak, activation_peak, self.activation_now)
        self._weight_segments = weight_segments
        self._kv_segments = kv_segments

    def set_activations(self, nbytes: int) -> None:
        self.activation_now = nbytes
        self.activation_peak = max(self.activation_peak, nbytes)

    @property
    def adapter_bytes(self) -> int:
        return sum(sum(a.blocks) for a in self._adapters.values())

    @property
    def cached_free_bytes(self) -> int:
        return sum(self._free_blocks)

    def reserved_bytes(self) -> int:
        return self.weights + self.kv_cache + self.activation_peak + self.adapter_bytes + self.cached_free_bytes

    def _capacity(self) -> int:
        return self.gpu.memory_bytes - self.gpu.driver_reserved_bytes - self.gpu.cuda_context_bytes

    def load_adapter(self, name: str, module_bytes: list[int]) -> bool:
        """Allocate an adapter's modules, reusing cached free blocks (best fit) first. When the device is full,
        empty the cache once (an alloc retry) and allocate afresh; if that fails too, count an OOM and
        allocate nothing (returns False)."""
        if name in self._adapters:
            return True
        sizes = [round_alloc(b) for b in module_bytes]
        free = sorted(self._free_blocks)
        taken: list[int] = []
        grow = 0
        for size in sizes:
            i = bisect.bisect_left(free, size)
            if i < len(free):
                taken.append(free.pop(i))
            else:
                taken.append(size)
                grow += size
        if self.reserved_bytes() + grow > self._capacity():
            self.alloc_retries += 1
            if self.reserved_bytes() - self.cached_free_bytes + sum(sizes) > self._capacity():
                self.ooms += 1
                return False
            free, taken = [], sizes
        self._free_blocks = free
        self._adapters[name] = _Adapter(blocks=taken, requested=sum(module_bytes))
        return True

    def free_adapter(self, name: str) -> None:
        adapter = self._adapters.pop(name, None)
        if adapter is not None:
            self._free_blocks.extend(adapter.blocks)

    # --- activity ------------------------------------------------------------------------------------------

    def record_busy(
        self, start: float, end: float, *, memory_fraction: float, intensity: float, tensor_fraction: float = 0.0
    ) -> None:
        """Kernels ran from ``start`` to ``end``; ``memory_fraction`` of that time the memory system was busy,
        ``tensor_fraction`` of it the tensor pipes, and ``intensity`` (0-1) scales the dynamic power."""
        if end <= start:
            return
        self.timeline.add(self._unix(start), self._unix(end), end - start)
        # Later intervals never start before this one, so every period ending by ``start`` is final.
        self._advance(start)
        p = self._period
        first = max(int((start - self._origin) / p), self._next)
        last = int((end - self._origin) / p)
        for k in range(first, last + 1):
            lo = max(start, self._origin + k * p)
            hi = min(end, self._origin + (k + 1) * p)
            if hi > lo:
                dt = hi - lo
                self._busy[k] = self._busy.get(k, 0.0) + dt
                self._mem_busy[k] = self._mem_busy.get(k, 0.0) + dt * memory_fraction
                self._heat[k] = self._heat.get(k, 0.0) + dt * intensity
                self._tensor[k] = self._tensor.get(k, 0.0) + dt * tensor_fraction

    def _unix(self, t: float) -> float:
        return self._real_origin + (t - self._origin)

    def _advance(self, now: float) -> None:
        """Finalise every sample period that has ended by ``now``."""
        p = self._period
        done = int((now - self._origin) / p + 1e-9)  # a period ending exactly at ``now`` is complete
        if done <= self._next:
            return
        ring = self._samples.maxlen or RING_SAMPLES
        if done - self._next > ring and not any(k < done - ring for k in self._busy):
            # Long idle gap with no activity: jump over it in closed form, keep a ring's worth of samples.
            skipped = done - ring - self._next
            self._idle_stretch(skipped * p)
            self._next += skipped
        g = self.gpu
        tau = 1.0 - math.exp(-p / POWER_SMOOTHING_SECONDS)
        lag = 1.0 - math.exp(-p / g.thermal.time_constant_seconds)
        for k in range(self._next, done):
            busy = min(self._busy.pop(k, 0.0), p)
            mem = min(self._mem_busy.pop(k, 0.0), p)
            heat = min(self._heat.pop(k, 0.0), p)
            self._gpm_busy += busy
            self._gpm_tensor += min(self._tensor.pop(k, 0.0), p)
            self._gpm_dram += mem
            self._util = busy / p
            self._mem_util = mem / p
            self._demand = g.power_idle_watts + (g.power_full_load_watts - g.power_idle_watts) * heat / p
            draw = min(self._demand, g.power_limit_watts)
            self._power += (draw - self._power) * tau
            self._energy += draw * p
            target = g.thermal.ambient_celsius + g.thermal.thermal_resistance_c_per_w * draw
            self._temp += (target - self._temp) * lag
            self._set_clock()
            ts = int((self._real_origin + (k + 1) * p) * 1e6)
            self._samples.append((ts, round(100.0 * self._util, 3)))
        self._next = done

    def _idle_stretch(self, seconds: float) -> None:
        g = self.gpu
        idle = g.power_idle_watts
        self._energy += idle * seconds
        self._power = idle + (self._power - idle) * math.exp(-seconds / POWER_SMOOTHING_SECONDS)
        target = g.thermal.ambient_celsius + g.thermal.thermal_resistance_c_per_w * idle
        self._temp = target + (self._temp - target) * math.exp(-seconds / g.thermal.time_constant_seconds)

    def _set_clock(self) -> None:
        g = self.gpu
        reasons: list[str] = []
        if self._util == 0.0:
            clock = g.idle_sm_clock_hz
            reasons.append("gpu_idle")
        else:
            clock = g.max_sm_clock_hz
            if self._demand > g.power_limit_watts:
                dynamic = (g.power_limit_watts - g.power_idle_watts) / (self._demand - g.power_idle_watts)
                clock *= max(0.5, dynamic)
                reasons.append("sw_power_cap")
        if self._temp > g.thermal.slowdown_celsius:
            clock *= THERMAL_SLOWDOWN_CLOCK
            reasons.append("sw_thermal_slowdown")
        self._clock_hz = max(clock, g.idle_sm_clock_hz)
        self._reasons = reasons

    # --- the document --------------------------------------------------------------------------------------

    def samples_since(self, since_us: int) -> list[tuple[int, float]]:
        self._advance(self._clock())
        return [s for s in self._samples if s[0] > since_us]

    def snapshot(self, since_us: int = 0) -> SimDevice:
        samples = self.samples_since(since_us)
        now = self._unix(self._clock())
        after = max(since_us / 1e6, now - WINDOW_S)
        steps = [
            BusyInterval(start_us=round(a * 1e6), end_us=round(b * 1e6)) for a, b in self.timeline.intervals(after)
        ]
        g = self.gpu
        adapters_alloc = self.adapter_bytes
        cached = self.cached_free_bytes
        act_slack = self.activation_peak - self.activation_now
        slack = act_slack + cached
        allocated = self.weights + self.kv_cache + self.activation_now + adapters_alloc
        requested = (
            self.weights + self.kv_cache + self.activation_now + sum(a.requested for a in self._adapters.values())
        )
        owners = MemoryByOwner(
            weights=self.weights,
            kv_cache=self.kv_cache,
            activations=self.activation_now,
            adapters=adapters_alloc,
            allocator_slack=slack,
            other=g.cuda_context_bytes,
        )
        used = self.weights + self.kv_cache + self.activation_now + adapters_alloc + slack + g.cuda_context_bytes
        segments = (
            self._weight_segments
            + self._kv_segments
            + 1
            + sum(len(a.blocks) for a in self._adapters.values())
            + len(self._free_blocks)
        )
        allocator = AllocatorState(
            reserved_bytes=allocated + slack,
            allocated_bytes=allocated,
            active_bytes=allocated,
            inactive_split_bytes=slack,
            requested_bytes=requested,
            segments=segments,
            alloc_retries=self.alloc_retries,
            ooms=self.ooms,
            largest_free_block_bytes=max([act_slack, *self._free_blocks]),
            total_free_bytes=slack,
        )
        return SimDevice(
            index=self.index,
            uuid=self.uuid,
            name=g.marketing_name,
            memory_total_bytes=g.memory_bytes,
            memory_used_bytes=used,
            memory_reserved_bytes=g.driver_reserved_bytes,
            memory_by_owner=owners,
            allocator=allocator,
            util_gpu_percent=round(100.0 * self._util, 3),
            util_memory_percent=round(100.0 * self._mem_util, 3),
            util_samples=[UtilSample(timestamp_us=ts, gpu_percent=pct) for ts, pct in samples],
            sample_interval_seconds=self._period,
            power_watts=round(self._power, 3),
            power_limit_watts=g.power_limit_watts,
            energy_joules=round(self._energy, 3),
            temperature_gpu_celsius=round(self._temp, 2),
            temperature_memory_celsius=round(self._temp + g.thermal.memory_offset_celsius, 2),
            sm_clock_hz=self._clock_hz,
            memory_clock_hz=g.memory_clock_hz,
            max_sm_clock_hz=g.max_sm_clock_hz,
            clock_event_reasons=list(self._reasons),
            processes=[DeviceProcess(pid=os.getpid(), name=_process_name(), used_bytes=used)],
            gpm=self.gpm_counters(),
            busy_intervals=steps,
            busy=self._busy_figures(now),
        )

    def _busy_figures(self, now: float) -> ProbeBusy:
        at = self._clock()
        if self._busy_cache is None or at - self._busy_cache[0] >= BUSY_REFRESH_SECONDS:
            self._busy_cache = (at, self._busy_report.section(now))
        return self._busy_cache[1]

    def gpm_counters(self) -> GpmCounters:
        """The cumulative GPM counters up to the last finalised sample period."""
        return GpmCounters(
            time_seconds=self._next * self._period,
            graphics_active_seconds=self._gpm_busy,
            sm_active_seconds=self._gpm_busy,
            sm_occupancy_seconds=self._gpm_busy * SM_OCCUPANCY_WHILE_BUSY,
            tensor_active_seconds=self._gpm_tensor,
            dram_active_seconds=self._gpm_dram,
        )


def _process_name() -> str:
    return sys.executable or "python"


def device_state(
    devices: list[SimulatedGPU], since_us: int = 0, *, realtime: Callable[[], float] = time.time
) -> dict[str, Any]:
    """The versioned document (a JSON-able dict) for ``GET /sim/device-state``."""
    doc = DeviceState(
        version=DEVICE_STATE_VERSION,
        timestamp_us=int(realtime() * 1e6),
        driver_version=DRIVER_VERSION,
        cuda_driver_version=CUDA_DRIVER_VERSION,
        devices=[d.snapshot(since_us) for d in devices],
    )
    return doc.model_dump()
