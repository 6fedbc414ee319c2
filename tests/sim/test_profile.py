"""Profiles: the packaged ones load and match their sources; broken files fail with one precise line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from exporters.serving.engines.sim import ProfileError, list_profiles, load_gpu_profile, load_model_profile
from exporters.serving.engines.sim.profile import GPU_DIR
from loadlens.contracts.model_profile import MODEL_DIR


def test_packaged_profiles_are_listed_and_load() -> None:
    names = list_profiles()
    assert names == {
        "gpus": ["a100-40gb-pcie", "a100-80gb-sxm", "h100-sxm", "h200"],
        "models": ["deepseek-r1-distill-llama-8b", "deepseek-vl-7b", "qwen2-72b", "qwen2.5-7b", "qwen3-8b", "tiny"],
    }
    for name in names["gpus"]:
        gpu = load_gpu_profile(name)
        assert gpu.name == name and gpu.source
    for name in names["models"]:
        model = load_model_profile(name)
        assert model.name == name and model.source


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("deepseek-r1-distill-llama-8b", (32, 4096, 32, 8, 128, 14336, 128256)),
        ("qwen2-72b", (80, 8192, 64, 8, 128, 29568, 152064)),
        ("qwen3-8b", (36, 4096, 32, 8, 128, 12288, 151936)),
        ("qwen2.5-7b", (28, 3584, 28, 4, 128, 18944, 152064)),
        ("deepseek-vl-7b", (30, 4096, 32, 32, 128, 11008, 102400)),
    ],
)
def test_model_shapes_match_their_configs(name: str, shape: tuple[int, ...]) -> None:
    m = load_model_profile(name)
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.intermediate, m.vocab) == shape
    assert abs(m.params - m.shape_params()) / m.params < 0.001


def test_vision_and_quantisation_fields() -> None:
    vl = load_model_profile("deepseek-vl-7b")
    assert vl.image_tokens_per_image == 576 and vl.dtype == "fp16"
    assert load_model_profile("qwen2-72b").dtype == "awq-4bit"
    assert load_model_profile("tiny").default_knobs == {}
    assert load_model_profile("deepseek-r1-distill-llama-8b").default_knobs == {"max_lora_rank": 64}


def test_gpu_spec_sheet_numbers() -> None:
    a100 = load_gpu_profile("a100-40gb-pcie")
    assert (a100.peak_tensor_flops, a100.hbm_bytes_per_s, a100.power_limit_watts) == (312e12, 1555e9, 250)
    h100 = load_gpu_profile("h100-sxm")
    assert (h100.peak_tensor_flops, h100.hbm_bytes_per_s, h100.power_limit_watts) == (989.5e12, 3350e9, 700)
    assert load_gpu_profile("h200").hbm_bytes_per_s == 4800e9


def test_a_user_file_by_path(tmp_path: Path) -> None:
    doc = yaml.safe_load((MODEL_DIR / "tiny.yaml").read_text())
    doc["name"] = "mine"
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert load_model_profile(str(path)).name == "mine"
    assert load_model_profile(str(path)).path == str(path)


def _broken(tmp_path: Path, base: Path, **changes: object) -> str:
    doc = yaml.safe_load(base.read_text())
    for key, value in changes.items():
        if value is None:
            del doc[key]
        else:
            doc[key] = value
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"layers": -1}, "field 'layers': must be >= 1, got -1"),
        ({"layers": None}, "field 'layers': missing"),
        ({"hidden": "wide"}, "field 'hidden': must be an integer, got 'wide'"),
        ({"dtype": "int8"}, "field 'dtype': must be one of bf16, fp16, awq-4bit, got 'int8'"),
        ({"kv_heads": 3}, "field 'kv_heads': must divide heads (4)"),
        ({"params": 1000}, "field 'params': 1000 is more than 20% away from the 1.134e+07 implied by"),
        ({"colour": "blue"}, "field 'colour': unknown field"),
        ({"image_tokens_per_image": 0}, "field 'vision_flops_per_image': set image_tokens_per_image too"),
        ({"default_knobs": [1]}, "field 'default_knobs': must be a mapping"),
    ],
)
def test_broken_model_profiles_name_file_and_field(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    path = _broken(tmp_path, MODEL_DIR / "tiny.yaml", **changes)
    with pytest.raises(ProfileError) as err:
        load_model_profile(path)
    text = str(err.value)
    assert re.match(rf"profile {re.escape(str(path))}:\d+:\d+: ", text), text  # FILE:LINE:COL
    assert message in text
    assert "\n" not in text


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"compute_efficiency": 1.5}, "field 'compute_efficiency': must be > 0.0 and <= 1.0, got 1.5"),
        ({"hbm_bytes_per_s": "fast"}, "field 'hbm_bytes_per_s': must be a number, got 'fast'"),
        ({"power_idle_watts": 900}, "field 'power_idle_watts': must be below power_limit_watts"),
        ({"thermal": {"ambient_celsius": 30}}, "field 'thermal.thermal_resistance_c_per_w': missing"),
        ({"marketing_name": None}, "field 'marketing_name': missing"),
        ({"step_spread_seconds": [0.001]}, "field 'step_spread_seconds': needs at least 2 values, got 1"),
        ({"step_spread_seconds": [0.001, -0.001]}, "field 'step_spread_seconds': must be ascending"),
        (
            {"step_spread_seconds": [0.0, 0.002]},
            "field 'step_spread_seconds': must have mean 0 (a spread around the modeled step), got 0.001",
        ),  # fmt: skip
        ({"step_spread_seconds": [-0.001, "late"]}, "field 'step_spread_seconds[1]': must be a number, got 'late'"),
        ({"step_spread_seconds": 0.001}, "field 'step_spread_seconds': must be a list of numbers, got 0.001"),
    ],
)
def test_broken_gpu_profiles_name_file_and_field(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    path = _broken(tmp_path, GPU_DIR / "h100-sxm.yaml", **changes)
    with pytest.raises(ProfileError) as err:
        load_gpu_profile(path)
    assert re.match(rf"profile {re.escape(str(path))}:\d+:\d+: ", str(err.value)), err.value  # FILE:LINE:COL
    assert message in str(err.value)


def test_unknown_names_unreadable_files_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"unknown GPU profile 'h300' \(known: a100-40gb-pcie, "):
        load_gpu_profile("h300")
    with pytest.raises(ProfileError, match="model profile file /nonexistent.yaml: not found"):
        load_model_profile("/nonexistent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ProfileError, match=f"profile {bad}: invalid YAML at line"):
        load_model_profile(str(bad))
    bad.write_text("- a list\n")
    with pytest.raises(ProfileError, match="expected a mapping of fields, got list"):
        load_model_profile(str(bad))


def test_invalid_default_knobs_in_a_profile_name_the_file(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from exporters.serving.engines.sim import SimEngine

    path = _broken(tmp_path, MODEL_DIR / "tiny.yaml", default_knobs={"max_num_seqs": "many"})
    with pytest.raises(ProfileError) as err:
        SimEngine(load_model_profile(path), load_gpu_profile("h100-sxm"), registry=CollectorRegistry())
    # Checked when the engine applies them, after the file was read: the file and field, no line.
    assert str(err.value).startswith(f"profile {path}: field 'default_knobs.max_num_seqs': ")


def test_a_broken_field_is_named_with_its_line_and_column(tmp_path: Path) -> None:
    text = (GPU_DIR / "h100-sxm.yaml").read_text().replace("  slowdown_celsius: 87\n", "  slowdown_celsius: 20\n")
    path = tmp_path / "gpu.yaml"
    path.write_text(text)
    line = text.splitlines().index("  slowdown_celsius: 20") + 1
    with pytest.raises(ProfileError) as err:
        load_gpu_profile(str(path))
    assert str(err.value) == (
        f"profile {path}:{line}:3: field 'thermal.slowdown_celsius': must be above ambient_celsius"
    )
