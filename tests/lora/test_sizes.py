"""The guide's size formula (seed guide 2.1) as loadlens/lora/sizes.py computes it."""

from __future__ import annotations

import pytest

from loadlens.lora.shapes import resolve
from loadlens.lora.sizes import adapter_size, lora_params

MIB = 1024 * 1024


def test_one_square_matrix_is_the_guides_2dr() -> None:
    # Guide 2.1: "2·4096·8·2 bytes = 0.125 MB" for one d×d matrix at r = 8 in bf16.
    assert lora_params(8, 4096, 4096) == 2 * 4096 * 8
    assert lora_params(8, 4096, 4096) * 2 == 131072 == 0.125 * MIB


def test_non_square_is_r_times_d_in_plus_d_out() -> None:
    assert lora_params(16, 4096, 14336) == 16 * (4096 + 14336)


@pytest.mark.parametrize(("rank", "mib"), [(2, 1.875), (8, 7.5), (32, 30.0)])
def test_guides_model_and_ranks(rank: int, mib: float) -> None:
    """The guide's ranks on its model (DeepSeek-VL-7B, 30 layers of 4096) with its 2.2 targets q_proj, v_proj,
    bf16: 30 x 2 x r x 8192 x 2 bytes. The guide's own MB column (0.8 / 3.1 / 12.4) does not follow from its
    formula (it says so itself); what both share is linearity in r, which the ratios check."""
    size = adapter_size(resolve("deepseek-vl-7b"), rank, ["q_proj", "v_proj"], "bf16")
    assert size.params == 30 * 2 * rank * 8192
    assert size.bytes == mib * MIB
    assert [(m.module, m.layers, m.params_per_layer) for m in size.modules] == [
        ("q_proj", 30, rank * 8192), ("v_proj", 30, rank * 8192)
    ]  # fmt: skip
    guide_mb = {2: 0.8, 8: 3.1, 32: 12.4}
    # The guide's figures, rounded to 0.1, are within their rounding of r x (12.4 / 32) as ours are exactly r x ...
    assert abs(guide_mb[rank] - rank * 12.4 / 32) <= 0.05 + 0.05 * rank / 32
    assert size.bytes == rank * adapter_size(resolve("deepseek-vl-7b"), 1, ["q_proj", "v_proj"], "bf16").bytes


def test_dtype_width_and_every_module() -> None:
    shape = resolve("deepseek-r1-distill-llama-8b")  # Llama-3.1-8B: 32 layers, 8 KV heads, 14336 intermediate
    size = adapter_size(shape, 64, [m.name for m in shape.modules], "fp32")
    per_layer = 64 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))  # q, o; k, v; gate, up, down
    assert size.params == 32 * per_layer
    assert size.bytes == 4 * 32 * per_layer
