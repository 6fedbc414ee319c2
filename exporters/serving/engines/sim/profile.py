"""The sim's profiles: GPU profiles and model profiles are both contracts (``loadlens/contracts/gpu_profile.py``,
``loadlens/contracts/model_profile.py``): ``loadlens gpu-bench`` and ``loadlens lora make`` read them too. This
module re-exports the GPU side for the sim's modules and lists both kinds::

    gpu = load_gpu_profile("h100-sxm")
    list_profiles()   # {"gpus": [...], "models": [...]}
"""

from __future__ import annotations

from loadlens.contracts.gpu_profile import GPU_DIR, GPUProfile, Thermal, gpu_profile_names, load_gpu_profile
from loadlens.contracts.model_profile import model_profile_names

__all__ = ["GPU_DIR", "GPUProfile", "Thermal", "list_profiles", "load_gpu_profile"]


def list_profiles() -> dict[str, list[str]]:
    """Names of the packaged profiles: ``{"gpus": [...], "models": [...]}``."""
    return {"gpus": gpu_profile_names(), "models": model_profile_names()}
