"""The real vLLM CPU rig's models as sim model profiles (benchmarks/calibration/): each profile states its model's
shape and parameter count, so calibrate's FLOPs and bytes are the served model's (docs/calibration.md)."""

from __future__ import annotations

import pytest

from loadlens.contracts.gpu_profile import load_gpu_profile
from loadlens.contracts.model_profile import load_model_profile
from tests.support.paths import ROOT
from tests.support.vllm_model import CALIBRATION, MAX_POSITIONS, TINY, Shape

PROFILES = {
    "tiny-llama.yaml": TINY,
    "small-llama.yaml": CALIBRATION,
}


def parameters(shape: Shape, vocab: int) -> int:
    """A Llama's parameters: per layer the four attention projections and the three MLP ones and two norms,
    then the untied embedding and LM head and the final norm."""
    head_dim = shape.hidden // shape.heads
    attention = 2 * shape.hidden * shape.heads * head_dim + 2 * shape.hidden * shape.kv_heads * head_dim
    mlp = 3 * shape.hidden * shape.intermediate
    return shape.layers * (attention + mlp + 2 * shape.hidden) + 2 * vocab * shape.hidden + shape.hidden


@pytest.mark.parametrize("file", sorted(PROFILES))
def test_profile_states_the_rig_models_shape(file: str) -> None:
    shape = PROFILES[file]
    profile = load_model_profile(str(ROOT / "benchmarks" / "calibration" / file))
    assert (profile.layers, profile.hidden, profile.heads, profile.kv_heads, profile.intermediate) == (
        shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.intermediate)  # fmt: skip
    assert profile.head_dim == shape.hidden // shape.heads
    assert profile.vocab == 1550
    assert profile.params == parameters(shape, profile.vocab)
    assert profile.max_model_len == MAX_POSITIONS
    assert profile.tie_word_embeddings is False
    assert profile.dtype == "bf16"


def test_the_parameter_count_matches_the_written_models() -> None:
    """The counts of the two models as written (their safetensors files, counted once by hand)."""
    assert parameters(TINY, 1550) == 692_352
    assert parameters(CALIBRATION, 1550) == 47_223_808


@pytest.mark.parametrize("file", ["tiny-llama-cpu-fitted.yaml", "small-llama-cpu-fitted.yaml"])
def test_the_fitted_profiles_load_as_sim_gpu_profiles(file: str) -> None:
    """What calibrate wrote from the rig's sweeps (docs/calibration.md, section 4) is a profile the sim serves."""
    profile = load_gpu_profile(str(ROOT / "benchmarks" / "calibration" / file))
    assert profile.name == file.removesuffix(".yaml")
    assert profile.source.startswith("fitted by loadlens calibrate on 2026-12-05")
    assert profile.compute_efficiency == 1.0 and profile.memory_efficiency == 1.0
