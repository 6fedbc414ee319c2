"""Deterministic example device-state documents (tests, the benchmark, docs and demos).

Not the simulated engine: a fixed picture of N GPUs built from the shared pydantic model, with a
square-wave utilisation (the guide's 2.2 table: one task ~68 % mean, 12 points peak-to-trough) and adapter
memory in 2 MiB blocks::

    state = example_state(n_gpus=2, n_processes=3)
    Path("device-state.json").write_text(state.model_dump_json())

    python -m tests.gpu.sim_example --gpus 8 --processes 64 > /tmp/device-state.json
"""

from __future__ import annotations

import argparse
import sys
import time

from loadlens.contracts.device_state import (
    DEVICE_STATE_VERSION,
    AllocatorState,
    DeviceProcess,
    DeviceState,
    GpmCounters,
    MemoryByOwner,
    SimDevice,
    UtilSample,
)
from loadlens.contracts.probe_document import BusySpread, ProbeBusy

GIB = 1024**3
MIB = 1024**2
# A fixed instant (2023-11-14T22:13:20Z) so documents and golden files are reproducible.
EXAMPLE_NOW_US = 1_700_000_000_000_000


def square_wave(n: int, low: float, high: float, half_period: int) -> list[float]:
    """``half_period`` samples at ``high``, then ``half_period`` at ``low``, repeated; percentages."""
    return [high if (i // half_period) % 2 == 0 else low for i in range(n)]


def example_device(
    index: int,
    *,
    now_us: int = EXAMPLE_NOW_US,
    n_processes: int = 3,
    n_samples: int = 60,
    sample_interval: float = 1 / 6,
    low: float = 62.0,
    high: float = 74.0,
    half_period: int = 3,
    adapters: int = 3,
) -> SimDevice:
    """One simulated H100 80GB; ``index`` shifts UUID and pids only (values are the same on every GPU)."""
    step_us = round(sample_interval * 1e6)
    values = square_wave(n_samples, low, high, half_period)
    first = now_us - step_us * (n_samples - 1)
    samples = [UtilSample(timestamp_us=first + i * step_us, gpu_percent=v) for i, v in enumerate(values)]
    owners = MemoryByOwner(
        weights=14 * GIB,
        kv_cache=54 * GIB,
        activations=2 * GIB,
        adapters=adapters * 64 * 2 * MIB,  # 64 LoRA modules per adapter, each ~1.2 MB rounded to a 2 MiB block
        allocator_slack=640 * MIB,
        other=1 * GIB,
    )
    used = sum(owners.model_dump().values())
    requested_adapters = adapters * 64 * 1_258_291  # ~1.2 MB asked per module
    allocated = owners.weights + owners.kv_cache + owners.activations + owners.adapters
    allocator = AllocatorState(
        reserved_bytes=allocated + owners.allocator_slack,
        allocated_bytes=allocated,
        active_bytes=allocated,
        inactive_split_bytes=256 * MIB,
        requested_bytes=allocated - owners.adapters + requested_adapters,
        segments=412,
        alloc_retries=2,
        ooms=0,
        largest_free_block_bytes=160 * MIB,
        total_free_bytes=owners.allocator_slack,
    )
    per_process = used // max(n_processes, 1)
    processes = [
        DeviceProcess(
            pid=10_000 + index * 1_000 + j,
            name="python3 -m vllm.entrypoints.openai.api_server" if j == 0 else f"python3 worker-{j}",
            used_bytes=per_process + (used - per_process * n_processes if j == 0 else 0),
        )
        for j in range(n_processes)
    ]
    return SimDevice(
        index=index,
        uuid=f"GPU-5e1f0000-0000-4000-8000-{index:012x}",
        name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=80 * GIB,
        memory_used_bytes=used,
        memory_reserved_bytes=512 * MIB,
        memory_by_owner=owners,
        allocator=allocator,
        util_gpu_percent=values[-1],
        util_memory_percent=41.0,
        util_samples=samples,
        sample_interval_seconds=sample_interval,
        power_watts=412.5,
        power_limit_watts=700.0,
        energy_joules=123_456.789,
        temperature_gpu_celsius=61.0,
        temperature_memory_celsius=68.0,
        sm_clock_hz=1_755e6,
        memory_clock_hz=2_619e6,
        max_sm_clock_hz=1_980e6,
        clock_event_reasons=["sw_power_cap"] if index % 2 else [],
        processes=processes,
        # Cumulative GPM counters after an hour (a static document: two samples of it read 0 activity).
        gpm=GpmCounters(
            time_seconds=3600.0,
            graphics_active_seconds=2448.0,
            sm_active_seconds=2160.0,
            sm_occupancy_seconds=540.0,
            tensor_active_seconds=1440.0,
            dram_active_seconds=1476.0,
            fp32_active_seconds=36.0,
            pcie_tx_bytes=3_600 * MIB,
            pcie_rx_bytes=7_200 * MIB,
        ),
        # The step schedule's figures: GPU 0 swings with guide 2.2's 84 ms period, GPU 1 runs steady.
        busy=ProbeBusy(
            source="sim_step",
            clock="sim_schedule",
            uuid=f"GPU-5e1f0000-0000-4000-8000-{index:012x}",
            window_start=1_699_999_990.0,
            window_seconds=10.0,
            resolution_seconds=0.001,
            swing_bin_seconds=0.01,
            busy_ratio=0.68 if index == 0 else 0.97,
            swing_ratio=0.5 if index == 0 else 0.02,
            period_seconds=0.084 if index == 0 else None,
            period_reason=None if index == 0 else "no_cycle",
            busy_run=BusySpread(p50=0.057, p95=0.06, max=0.061),
            idle_gap=BusySpread(p50=0.027, p95=0.03, max=0.031),
            intervals_total=42_000,
            busy_seconds_total=2_400.0,
            idle_gap_bounds=[0.01, 0.05],
            idle_gap_counts=[100, 41_900],
            idle_gap_count=41_999,
            idle_gap_sum=1_130.0,
        ),
    )


def example_state(
    n_gpus: int = 2,
    n_processes: int = 3,
    *,
    now_us: int = EXAMPLE_NOW_US,
    n_samples: int = 60,
    sample_interval: float = 1 / 6,
) -> DeviceState:
    return DeviceState(
        version=DEVICE_STATE_VERSION,
        timestamp_us=now_us,
        driver_version="550.54.15",
        cuda_driver_version=12040,
        devices=[
            example_device(
                i, now_us=now_us, n_processes=n_processes, n_samples=n_samples, sample_interval=sample_interval
            )
            for i in range(n_gpus)
        ],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Print an example device-state document.")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--samples", type=int, default=60)
    p.add_argument("--sample-interval", type=float, default=1 / 6)
    p.add_argument("--now", action="store_true", help="timestamps end now instead of at a fixed instant")
    a = p.parse_args(argv)
    now_us = time.time_ns() // 1000 if a.now else EXAMPLE_NOW_US
    state = example_state(a.gpus, a.processes, now_us=now_us, n_samples=a.samples, sample_interval=a.sample_interval)
    sys.stdout.write(state.model_dump_json(indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
