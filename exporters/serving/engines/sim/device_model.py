"""What the engine's work does to its simulated GPU (:mod:`.device`): memory by owner from the knobs, adapter
allocations, and each priced step as a busy interval with its memory share and power intensity."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from exporters.serving.engines.sim import roofline
from exporters.serving.engines.sim.device import SimulatedGPU, device_state
from exporters.serving.engines.sim.knobs import Knobs
from exporters.serving.engines.sim.profile import GPUProfile
from exporters.serving.engines.sim.roofline import BatchShape, StepCost
from exporters.serving.engines.sim.sched_types import Adapter
from loadlens.contracts.model_profile import ModelProfile


def roofline_intensity(compute_seconds: float, slowest: float) -> float:
    """Power intensity of a step: 0.55 memory-bound ... 1.0 compute-bound."""
    if slowest <= 0:
        return 0.0
    return 0.55 + 0.45 * compute_seconds / slowest  # literals: 1 - 0.55 is not 0.45 in binary


class DeviceModel:
    """One model on one simulated GPU. Instants are ``clock`` seconds (the engine's: ``time.monotonic()``)."""

    def __init__(
        self,
        model: ModelProfile,
        gpu: GPUProfile,
        *,
        seed: int,
        device: SimulatedGPU | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.device = device if device is not None else SimulatedGPU(gpu, seed=seed, clock=clock)

    def configure(self, k: Knobs) -> None:
        """Weights, the whole KV cache (preallocated, as vLLM does) and the activation reservation."""
        model = self.model
        self.device.configure_memory(
            weights=roofline.weight_bytes(model),
            kv_cache=(k.num_gpu_blocks or 0) * roofline.kv_block_bytes(model),
            activation_peak=roofline.activation_bytes(model, k.max_num_batched_tokens, k.max_num_seqs),
            weight_segments=model.layers + 2,
            kv_segments=model.layers,
        )

    def load_adapter(self, adapter: Adapter) -> bool:
        """Allocate an adapter's modules; False when the device is out of memory."""
        modules = roofline.adapter_module_bytes(self.model, adapter.rank, adapter.target_modules)
        return self.device.load_adapter(adapter.name, modules)

    def free_adapter(self, adapter: Adapter) -> None:
        self.device.free_adapter(adapter.name)

    def record_step(self, cost: StepCost, shape: BatchShape, *, busy_start: float, end: float) -> None:
        """Kernels run from ``busy_start`` (after stalls and host overhead) to ``end``."""
        slowest = max(cost.compute_seconds, cost.memory_seconds)
        self.device.record_busy(
            busy_start,
            end,
            memory_fraction=min(1.0, cost.memory_seconds / cost.busy_seconds) if cost.busy_seconds else 0.0,
            intensity=roofline_intensity(cost.compute_seconds, slowest),
            tensor_fraction=min(1.0, cost.compute_seconds / cost.busy_seconds) if cost.busy_seconds else 0.0,
        )
        self.device.set_activations(roofline.activation_bytes(self.model, shape.num_tokens, shape.num_seqs))

    def state(self, since_us: int = 0) -> Mapping[str, Any]:
        return device_state([self.device], since_us)
