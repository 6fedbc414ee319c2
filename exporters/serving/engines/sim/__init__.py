"""The simulated vLLM-like engine: profiles, roofline step times, a V1-style scheduler and a simulated GPU.

Usage::

    from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile

    engine = SimEngine(load_model_profile("deepseek-r1-distill-llama-8b"), load_gpu_profile("h100-sxm"),
                       registry=registry, speed=1.0, seed=0, knobs={"scheduling_policy": "priority"})

See docs/sim-engine.md for the model, the knobs and every series it emits.
"""

from __future__ import annotations

from exporters.serving.engines.sim.engine import SimEngine
from exporters.serving.engines.sim.knobs import KNOB_NAMES, Knobs
from exporters.serving.engines.sim.profile import GPUProfile, list_profiles, load_gpu_profile
from loadlens.contracts.model_profile import ModelProfile, load_model_profile
from loadlens.contracts.profile_schema import ProfileError

__all__ = [
    "KNOB_NAMES",
    "GPUProfile",
    "Knobs",
    "ModelProfile",
    "ProfileError",
    "SimEngine",
    "list_profiles",
    "load_gpu_profile",
    "load_model_profile",
]
