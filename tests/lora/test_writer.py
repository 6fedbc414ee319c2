"""The safetensors file and adapter_config.json that loadlens/lora/writer.py writes, read back by hand."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadlens.lora import writer
from loadlens.lora.shapes import from_hf_config
from loadlens.lora.sizes import adapter_size

CONFIG = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2}  # fmt: skip
SHAPE = from_hf_config(CONFIG, "small")


def read(path: Path) -> tuple[dict[str, Any], bytes, int]:
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + length]), blob[8 + length :], 8 + length


def write(out: Path, **kw: Any) -> writer.Written:
    args: dict[str, Any] = dict(rank=4, alpha=8, target_modules=["q_proj", "down_proj"], dtype="bf16", seed=7,
                                random_b=True, base_name="small")  # fmt: skip
    out.mkdir(exist_ok=True)
    return writer.write_adapter(out, SHAPE, **(args | kw))


def test_tensor_names_shapes_and_offsets(tmp_path: Path) -> None:
    written = write(tmp_path)
    head, data, head_len = read(tmp_path / writer.WEIGHTS_FILE)
    assert head.pop("__metadata__") == {"format": "pt"}
    stem = "base_model.model.model.layers"
    assert {k: (v["dtype"], v["shape"]) for k, v in head.items()} == {
        f"{stem}.{i}.{path}.lora_{ab}.weight": ("BF16", shape)
        for i in range(2)
        for path, ab, shape in [("self_attn.q_proj", "A", [4, 64]), ("self_attn.q_proj", "B", [64, 4]),
                                ("mlp.down_proj", "A", [4, 96]), ("mlp.down_proj", "B", [64, 4])]
    }  # fmt: skip
    spans = sorted(tuple(v["data_offsets"]) for v in head.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert spans[-1][1] == len(data) == written.tensor_bytes
    assert head_len % 8 == 0 and written.header_bytes == head_len
    size = adapter_size(SHAPE, 4, ["q_proj", "down_proj"], "bf16")
    assert written.file_bytes == head_len + size.bytes == (tmp_path / writer.WEIGHTS_FILE).stat().st_size
    assert written.tensors == 8


def test_values_bf16_rounding_seed_and_zero_b(tmp_path: Path) -> None:
    write(tmp_path / "a")
    write(tmp_path / "b")
    write(tmp_path / "c", seed=8)
    write(tmp_path / "z", random_b=False)
    files = {k: (tmp_path / k / writer.WEIGHTS_FILE).read_bytes() for k in "abcz"}
    assert files["a"] == files["b"] and files["a"] != files["c"]
    head, data, _ = read(tmp_path / "z" / writer.WEIGHTS_FILE)
    for name, meta in head.items():
        if name.endswith("lora_B.weight"):
            start, end = meta["data_offsets"]
            assert data[start:end] == bytes(end - start)
    head, data, _ = read(tmp_path / "a" / writer.WEIGHTS_FILE)
    a = head["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"]
    bits = np.frombuffer(data[slice(*a["data_offsets"])], dtype="<u2").astype("<u4") << 16
    values = bits.view("<f4")
    assert np.abs(values).max() <= 1 / np.sqrt(96) and np.abs(values).min() >= 0  # PEFT's bound for d_in 96


def test_bf16_rounds_to_nearest_even() -> None:
    values = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 1.0 + 2**-9], dtype=np.float32)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0); 1 + 3·2^-8 to 1 + 2^-6.
    assert struct.unpack("<5H", writer._encode(values, "bf16")) == (0x3F80, 0x3F80, 0x3F82, 0xC020, 0x3F80)
    assert writer._encode(values, "fp32") == values.astype("<f4").tobytes()


@pytest.mark.parametrize(("dtype", "code", "width"), [("fp16", "F16", 2), ("fp32", "F32", 4)])
def test_other_dtypes(tmp_path: Path, dtype: str, code: str, width: int) -> None:
    written = write(tmp_path, dtype=dtype)
    head, data, _ = read(tmp_path / writer.WEIGHTS_FILE)
    assert {v["dtype"] for k, v in head.items() if k != "__metadata__"} == {code}
    assert len(data) == adapter_size(SHAPE, 4, ["q_proj", "down_proj"], dtype).bytes == written.tensor_bytes
    assert len(data) == width * 2 * 4 * ((64 + 64) + (96 + 64))


def test_adapter_config(tmp_path: Path) -> None:
    write(tmp_path, alpha=12.5)
    doc = json.loads((tmp_path / writer.CONFIG_FILE).read_text())
    assert (doc["peft_type"], doc["r"], doc["lora_alpha"], doc["target_modules"]) == (
        "LORA",
        4,
        12.5,
        ["q_proj", "down_proj"],
    )
    assert doc["base_model_name_or_path"] == "small"
