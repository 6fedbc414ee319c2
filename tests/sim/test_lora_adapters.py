"""Adapter handling outside the engine: adapter_config.json parsing and sizing, and the registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.serving.engine import EngineError, ErrorKind, GenerationRequest, LoRARequest, SamplingParams
from exporters.serving.engines.sim import load_model_profile
from exporters.serving.engines.sim.lora_adapters import AdapterRegistry, read_adapter
from tests.sim.helpers import write_adapter

LLAMA = load_model_profile("deepseek-r1-distill-llama-8b")


def gen(model: str, lora: LoRARequest | None = None) -> GenerationRequest:
    return GenerationRequest("r", "chat", model, "p", 0, SamplingParams(max_tokens=1), 0.0, lora=lora)


def test_read_adapter_sizes_the_target_modules(tmp_path: Path) -> None:
    path = write_adapter(tmp_path, "sql", r=8, alpha=32, modules=["model.layers.0.self_attn.v_proj", "q_proj"])
    a = read_adapter(LoRARequest("sql", 7, str(path)), LLAMA)
    assert (a.name, a.int_id, a.path, a.rank, a.alpha) == ("sql", 7, str(path), 8, 32.0)
    assert a.target_modules == ("q_proj", "v_proj")  # the model's order, dotted names reduced
    assert a.params == 32 * 8 * ((4096 + 4096) + (4096 + 1024))
    assert a.nbytes == a.params * 2


@pytest.mark.parametrize(
    ("modules", "expected"),
    [
        ("all-linear", ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
        (r".*\.(q|v)_proj", ("q_proj", "v_proj")),
        (r".*mlp\..*", ("gate_proj", "up_proj", "down_proj")),
    ],
)
def test_string_target_modules(tmp_path: Path, modules: str, expected: tuple[str, ...]) -> None:
    a = read_adapter(LoRARequest("x", 1, str(write_adapter(tmp_path, "x", modules=modules))), LLAMA)
    assert a.target_modules == expected


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        (
            '{"r": 8, "lora_alpha": "big", "target_modules": ["q_proj"]}',
            "field 'lora_alpha' must be a number, got 'big'",
        ),
        ('{"r": true, "target_modules": ["q_proj"]}', "field 'r' must be a positive integer, got True"),
        ('{"r": 8, "target_modules": "("}', "target_modules is not a valid regular expression"),
        ('{"r": 8, "target_modules": "nothing"}', "target_modules 'nothing' matches no linear layer of"),
        ('{"r": 8, "target_modules": []}', "field 'target_modules' must be a list of names or a string, got []"),
        ("[1]", "adapter_config.json must hold a JSON object"),
    ],
)
def test_bad_configs_name_lora_path(tmp_path: Path, doc: str, text: str) -> None:
    (tmp_path / "adapter_config.json").write_text(doc, encoding="utf-8")
    with pytest.raises(EngineError) as err:
        read_adapter(LoRARequest("bad", 1, str(tmp_path)), LLAMA)
    assert err.value.kind is ErrorKind.INVALID_REQUEST
    assert err.value.param == "lora_path"
    assert err.value.message.startswith("Loading lora bad failed: ")
    assert text in err.value.message


def test_registry_checks_names_ranks_and_resolves_models(tmp_path: Path) -> None:
    reg = AdapterRegistry(LLAMA, "base")
    lora = LoRARequest("sql", 2, str(write_adapter(tmp_path, "sql", r=32)))
    with pytest.raises(EngineError) as err:
        reg.prepare(lora, max_lora_rank=16)
    assert err.value.message == "LoRA rank 32 is greater than max_lora_rank 16."
    assert len(reg) == 0  # prepare registers nothing
    reg.add(reg.prepare(lora, max_lora_rank=64))
    other = LoRARequest("chat", 1, str(write_adapter(tmp_path, "chat", r=8)))
    reg.start_loading("chat")
    for name in ("sql", "chat", "base"):  # registered, loading, the base model's own name
        with pytest.raises(EngineError) as err:
            reg.prepare(LoRARequest(name, 9, other.lora_path), max_lora_rank=64)
        assert err.value.message == f"The lora adapter '{name}' has already been loaded."
    reg.done_loading("chat")
    reg.add(reg.prepare(other, max_lora_rank=64))
    assert reg.max_rank() == 32
    assert [(c.id, c.parent) for c in reg.cards()] == [("chat", "base"), ("sql", "base")]  # by int id
    assert reg.resolve(gen("base")) is None
    resolved = reg.resolve(gen("sql"))
    assert resolved is not None and resolved.name == "sql"
    with pytest.raises(EngineError) as err:
        reg.resolve(gen("base", lora=LoRARequest("base", 3, "/x")))  # an adapter request never means the base
    assert (err.value.kind, err.value.message) == (ErrorKind.NOT_FOUND, "The model `base` does not exist.")
    assert reg.remove("sql").name == "sql"
    with pytest.raises(EngineError) as err:
        reg.remove("sql")
    assert (err.value.kind, err.value.param) == (ErrorKind.NOT_FOUND, "lora_name")
    assert reg.max_rank() == 8
