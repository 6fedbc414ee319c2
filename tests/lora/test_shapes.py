"""Module shapes read from Hugging Face configs and sim profiles (loadlens/lora/shapes.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadlens.lora.shapes import ShapeError, from_hf_config, resolve

# The fields that decide the shapes, as in each model's config.json on the Hub.
LLAMA_3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
}  # fmt: skip
QWEN2_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
    "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
}  # fmt: skip
DEEPSEEK_VL_7B: dict[str, Any] = {  # the language model nested under language_config
    "language_config": {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                        "num_key_value_heads": 32, "num_hidden_layers": 30},
    "vision_config": {"hidden_size": 1024},
}  # fmt: skip


def dims(doc: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {m.name: (m.d_in, m.d_out) for m in from_hf_config(doc, "config.json").modules}


def test_llama_grouped_query_attention() -> None:
    shape = from_hf_config(LLAMA_3_8B, "llama")
    assert shape.layers == 32
    assert dims(LLAMA_3_8B) == {
        "q_proj": (4096, 4096), "k_proj": (4096, 1024), "v_proj": (4096, 1024), "o_proj": (4096, 4096),
        "gate_proj": (4096, 14336), "up_proj": (4096, 14336), "down_proj": (14336, 4096),
    }  # fmt: skip
    assert [(m.name, m.parent) for m in shape.modules][::3] == [
        ("q_proj", "self_attn"), ("o_proj", "self_attn"), ("down_proj", "mlp")
    ]  # fmt: skip


def test_qwen2_head_dim_from_hidden_over_heads() -> None:
    assert dims(QWEN2_7B)["k_proj"] == (3584, 512)  # 4 KV heads of 128
    assert dims(QWEN2_7B)["q_proj"] == (3584, 3584)


def test_explicit_head_dim_wins() -> None:  # Qwen3: head_dim 128 with 32 heads over hidden 2560
    doc = {**QWEN2_7B, "hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
    assert dims(doc)["q_proj"] == (2560, 4096)
    assert dims(doc)["o_proj"] == (4096, 2560)


def test_deepseek_vl_language_config_is_read() -> None:
    shape = from_hf_config(DEEPSEEK_VL_7B, "vl")
    assert shape.layers == 30
    assert dims(DEEPSEEK_VL_7B)["v_proj"] == (4096, 4096)


def test_mixture_of_experts_offers_attention_only() -> None:
    shape = from_hf_config({**LLAMA_3_8B, "num_local_experts": 8}, "mixtral")
    assert [m.name for m in shape.modules] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    with pytest.raises(
        ShapeError, match=r"^target module 'gate_proj' is not a linear layer of mixtral \(known: q_proj"
    ):
        shape.module("gate_proj")


def test_latent_attention_is_refused() -> None:
    with pytest.raises(ShapeError, match=r"^v3: multi-head latent attention"):
        from_hf_config({**LLAMA_3_8B, "kv_lora_rank": 512}, "v3")


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        ({**LLAMA_3_8B, "hidden_size": 0}, "field 'hidden_size' must be a positive integer, got 0"),
        ({k: v for k, v in LLAMA_3_8B.items() if k != "num_hidden_layers"}, "'num_hidden_layers' must be a positive"),
        ({**LLAMA_3_8B, "num_attention_heads": 30}, "hidden_size 4096 is not a multiple of num_attention_heads 30"),
        ([1, 2], "config.json must hold a JSON object"),
    ],
)
def test_bad_config(doc: Any, reason: str) -> None:
    with pytest.raises(ShapeError, match=reason):
        from_hf_config(doc, "c")


def test_resolve_file_directory_and_profile(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B))
    assert resolve(str(tmp_path)).modules == resolve(str(tmp_path / "config.json")).modules
    assert resolve(str(tmp_path)).layers == 32
    tiny = resolve("tiny")  # the packaged sim profile: hidden 256, 4 heads of 64, 2 KV heads, intermediate 768
    assert (tiny.name, tiny.layers) == ("tiny", 4)
    assert {m.name: (m.d_in, m.d_out) for m in tiny.modules}["k_proj"] == (256, 128)
    assert {m.name: (m.d_in, m.d_out) for m in tiny.modules}["down_proj"] == (768, 256)


def test_resolve_errors(tmp_path: Path) -> None:
    with pytest.raises(ShapeError, match="no config.json in this directory"):
        resolve(str(tmp_path))
    with pytest.raises(ShapeError, match="unknown model profile 'nope'"):
        resolve("nope")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ShapeError, match="cannot read config.json"):
        resolve(str(tmp_path / "config.json"))
