"""The MFU estimate (loadlens/contracts/mfu.py) and the model reader behind it (model_config.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadlens.contracts import mfu, model_config

# The tests/vllm rig's tiny Llama (tests/support/vllm_model.py), as its config.json says.
RIG = {
    "architectures": ["LlamaForCausalLM"],
    "dtype": "bfloat16",
    "head_dim": 32,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "vocab_size": 1550,
}


def _estimate(entries: list[tuple[int, int, bool]]) -> tuple[float, float, float]:
    work = mfu.Work(steps=1)
    for n, context, prefill in entries:
        work.add(n, context, prefill=prefill)
    e = mfu.estimate(mfu.shape(model_config.from_hf_config(RIG, "rig")), work)
    return e.flops, e.read_bytes, e.write_bytes


@pytest.mark.parametrize(
    ("entries", "want"),
    [
        # vLLM 0.32.0's ModelMetrics (vllm/v1/metrics/perf.py: attention, FFN and unembedding components)
        # evaluated for the same shape and steps gave these figures.
        ([(100, 100, True)], (69_619_200, 1_550_080, 566_300)),
        ([(1, 57, False)], (1_044_992, 1_021_184, 8_732)),
        ([(30, 130, True), (1, 57, False), (1, 300, False)], (24_423_936, 1_400_576, 189_524)),
    ],
)
def test_one_step_matches_vllms_own_estimate(entries: list[tuple[int, int, bool]], want: tuple[int, ...]) -> None:
    assert _estimate(entries) == want


def test_a_requests_steps_are_one_prefill_and_a_decode_per_further_token() -> None:
    work = mfu.request_work(10, 4, cached_tokens=3)
    steps = mfu.Work(steps=4)
    steps.add(7, 10, prefill=True)
    for context in (11, 12, 13):
        steps.add(1, context, prefill=False)
    assert work == steps


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_local_experts": 8}, "rig: field 'num_local_experts': a mixture-of-experts model"),
        ({"vocab_size": None}, "rig: field 'vocab_size' is missing"),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "rig: field 'quantization_config.quant_method'"),
        ({"num_hidden_layers": 0}, "rig: field 'num_hidden_layers' must be a positive integer, got 0"),
    ],
)
def test_a_model_the_estimate_cannot_count_is_refused_naming_the_field(change: dict[str, object], message: str) -> None:
    doc = {k: v for k, v in {**RIG, **change}.items() if v is not None}
    with pytest.raises(model_config.ModelConfigError) as err:
        mfu.shape(model_config.from_hf_config(doc, "rig"))
    assert str(err.value).startswith(message)


def test_quantised_weights_read_fewer_bytes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**RIG, "quantization_config": {"quant_method": "awq"}}))
    shape = mfu.shape(model_config.resolve(str(tmp_path)))
    assert shape.weight_bytes == 0.5
    # Decoder weights at half a byte; the LM head stays 16-bit (as vLLM's unembedding term).
    assert mfu.weight_read_bytes(shape) == 2 * (128 * 8 * 32 + 4 * 32 * 128 + 3 * 128 * 256) * 0.5 + 128 * 1550 * 2


def test_a_missing_config_json_is_named_not_taken_for_a_profile(tmp_path: Path) -> None:
    missing = tmp_path / "config.json"
    with pytest.raises(model_config.ModelConfigError) as err:
        model_config.resolve(str(missing))
    assert str(err.value).startswith(f"{missing}: cannot read config.json: ")
