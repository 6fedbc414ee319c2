"""GPU profiles: a GPU's datasheet figures and the sim's calibration (efficiencies, overheads, thermal
constants), as YAML data. The sim prices its steps and drives its simulated device from them; ``loadlens
gpu-bench`` reads the peaks (dense tensor FLOP/s, HBM bytes/s) to state a measurement's share of peak, and
writes a measured profile the sim loads (docs/gpu-bench.md).

Packaged GPU profiles live in ``gpu_profiles/*.yaml`` next to this module; a user passes a name (``h100-sxm``)
or a path to their own file (``loadlens/contracts/packaged.py``: a value with a ``/`` or a ``.yaml`` suffix is a
path). Validation is strict (``loadlens/contracts/profile_schema.py``: one line naming the file, the line and
the field, as :class:`ProfileError`)::

    gpu = load_gpu_profile("h100-sxm")
    gpu_profile_names()                        # ["a100-40gb-pcie", ...]
    profile_for_device("NVIDIA H200")          # the packaged profile whose marketing_name NVML reports
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from loadlens.contracts.packaged import packaged_names
from loadlens.contracts.profile_schema import (
    Count,
    Fraction,
    KnobDefaults,
    NonNegative,
    Positive,
    ProfileFile,
    ProfileModel,
    SecondsList,
    Text,
    integer,
    load_profile,
    number,
    require,
)

GPU_DIR = Path(__file__).with_name("gpu_profiles")
SPREAD_MEAN_TOLERANCE_S = 1e-6
"""How far ``step_spread_seconds``' mean may be from 0 (its values are written rounded)."""


class Thermal(ProfileModel):
    ambient_celsius: Annotated[float, number(-40, strict=False)]
    thermal_resistance_c_per_w: Positive
    """Steady-state rise above ambient per watt drawn."""
    time_constant_seconds: Positive
    """First-order lag of the die temperature."""
    memory_offset_celsius: Annotated[float, number(-50, strict=False)]
    """HBM runs this much hotter than the GPU die at the same power."""
    slowdown_celsius: Positive
    """Above this the driver reports ``sw_thermal_slowdown`` and lowers clocks."""


class GPUProfile(ProfileFile):
    name: Text
    marketing_name: Text
    source: Text
    memory_bytes: Count
    driver_reserved_bytes: Annotated[int, integer(0)]
    cuda_context_bytes: Annotated[int, integer(0)]
    """CUDA context, cuBLAS workspaces and CUDA graphs: memory outside PyTorch's allocator."""
    peak_tensor_flops: Positive
    """Dense BF16/FP16 tensor-core FLOP/s (no sparsity)."""
    vector_flops: Positive
    """FP32 CUDA-core FLOP/s (non-tensor): used for AWQ dequantisation."""
    hbm_bytes_per_s: Positive
    compute_efficiency: Fraction
    memory_efficiency: Fraction
    power_idle_watts: Positive
    power_limit_watts: Positive
    power_full_load_watts: Positive
    """What a fully busy, compute-bound GPU would draw uncapped; above the limit it is capped (sw_power_cap)."""
    max_sm_clock_hz: Positive
    idle_sm_clock_hz: Positive
    memory_clock_hz: Positive
    host_to_device_bytes_per_s: Positive
    adapter_read_bytes_per_s: Positive
    """Storage to host for a LoRA adapter's safetensors (page cache cold)."""
    adapter_load_fixed_seconds: NonNegative
    step_overhead_seconds: NonNegative
    """Host time per engine step (scheduling, input preparation, sampling): the GPU idles meanwhile."""
    per_seq_overhead_seconds: NonNegative
    layer_overhead_seconds: NonNegative
    """Kernel launch cost per layer per step (small: CUDA graphs)."""
    lora_kernel_overhead_seconds: NonNegative
    """Launch cost of one LoRA shrink+expand pair per target module per layer, per distinct adapter."""
    lora_compute_efficiency: Fraction
    """Tensor-core efficiency of LoRA matmuls at rank 16; small ranks are launch/latency bound."""
    thermal: Thermal
    default_knobs: KnobDefaults = Field(default_factory=dict)
    frontend_fixed_seconds: NonNegative = 0.0
    """API-server time per request outside the engine core that vLLM's series cannot place (input processing
    and the hop to the engine core, the fixed part of output processing): the sim spends it between the
    request's arrival stamp and its entry into the waiting queue (docs/sim-engine.md §1, *Frontend*)."""
    frontend_per_running_seconds: NonNegative = 0.0
    """Output processing per running request: a step's tokens reach the streams, and vLLM's TTFT and E2E
    stamps, this × the step's sequences after the step ends (in order: never before the previous step's)."""
    step_spread_seconds: SecondsList = ()
    """The engine step's spread around its modeled time, seconds: equal-probability shares of a measured
    engine's steps, each value the mean of one share of the steps' differences from their batch's mean,
    ascending, their mean 0. The sim adds one drawn at random to each step's modeled time (``loadlens
    calibrate`` measures it from vLLM's step log); empty: every step takes its modeled time."""
    decode_step_offsets_seconds: SecondsList = ()
    """Seconds added to the modeled time of a decode-only step (no request in its context phase) of b
    sequences: item b − 1; a batch past the list gets none. A measured engine's step by batch, where it
    departs from the fitted formula (a staircase of CUDA graph sizes, a CPU build's thread split): ``loadlens
    calibrate`` measures each from vLLM's step log against the fit; empty: every step is the formula's."""

    def decode_step_offset(self, batch: int) -> float:
        """The seconds ``decode_step_offsets_seconds`` adds to a decode-only step of ``batch`` sequences."""
        offsets = self.decode_step_offsets_seconds
        return offsets[batch - 1] if 1 <= batch <= len(offsets) else 0.0

    def _consistent(self) -> None:
        require(self.driver_reserved_bytes + self.cuda_context_bytes < self.memory_bytes, "driver_reserved_bytes",
                "driver reservation plus CUDA context must be smaller than memory_bytes")  # fmt: skip
        require(self.power_idle_watts < self.power_limit_watts, "power_idle_watts", "must be below power_limit_watts")
        require(self.idle_sm_clock_hz <= self.max_sm_clock_hz, "idle_sm_clock_hz", "must be <= max_sm_clock_hz")
        require(self.thermal.slowdown_celsius > self.thermal.ambient_celsius, "thermal.slowdown_celsius",
                "must be above ambient_celsius")  # fmt: skip
        spread = self.step_spread_seconds
        if spread:
            require(len(spread) >= 2, "step_spread_seconds", f"needs at least 2 values, got {len(spread)}")
            require(all(a <= b for a, b in zip(spread, spread[1:], strict=False)), "step_spread_seconds",
                    "must be ascending")  # fmt: skip
            mean = sum(spread) / len(spread)
            require(abs(mean) <= SPREAD_MEAN_TOLERANCE_S, "step_spread_seconds",
                    f"must have mean 0 (a spread around the modeled step), got {mean:.6g}")  # fmt: skip


def gpu_profile_names() -> list[str]:
    """Names of the packaged GPU profiles."""
    return packaged_names(GPU_DIR)


def load_gpu_profile(name_or_path: str) -> GPUProfile:
    """A packaged GPU profile by name, or a profile YAML file; raises ``ProfileError`` (one line)."""
    return load_profile(name_or_path, GPU_DIR, "GPU", GPUProfile)


def profile_for_device(device_name: str) -> GPUProfile | None:
    """The packaged profile whose ``marketing_name`` is ``device_name`` (as NVML and ``torch.cuda`` spell it,
    compared without case), or None; the first by profile name wins if two share one."""
    wanted = device_name.strip().casefold()
    for name in gpu_profile_names():
        profile = load_gpu_profile(name)
        if profile.marketing_name.strip().casefold() == wanted:
            return profile
    return None
