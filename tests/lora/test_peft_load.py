"""An adapter written by ``loadlens lora make`` loads in PEFT (``PeftModel.from_pretrained``) on a tiny
random-weight Llama built from a config, on the CPU: its weights are the file's, a random B changes the
output and a zero B does not."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from loadlens.cli import main
from tests.support import required

torch: Any = required.require_module("torch")
required.require_module("transformers")
required.require_module("peft")


def base(tmp_path: Path) -> tuple[Path, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)  # fmt: skip
    model_dir = tmp_path / "base"
    config.save_pretrained(model_dir)  # only config.json: lora make reads the shape from it
    model: Any = LlamaForCausalLM(config)
    return model_dir, model.eval()


def peft_logits(model: Any, adapter: Path, ids: Any) -> tuple[Any, dict[str, Any]]:
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT warns about its own deprecations
        wrapped = PeftModel.from_pretrained(model, str(adapter)).eval()
    with torch.no_grad():
        logits = wrapped(ids).logits
    state = {k: v.detach().clone() for k, v in wrapped.state_dict().items() if "lora_" in k}
    wrapped.unload()  # the base model back without LoRA layers, for the next adapter
    return logits, state


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_adapter_loads_in_peft_and_changes_the_output(tmp_path: Path, dtype: str) -> None:
    from safetensors.torch import load_file

    model_dir, model = base(tmp_path)
    model = model.to(torch.float32 if dtype == "fp32" else torch.bfloat16)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        plain = model(ids).logits
    made = {}
    for init in ("random", "zero"):
        out = tmp_path / init
        argv = ["lora", "make", str(model_dir), "--out", str(out), "--rank", "4", "--target-modules",
                "q_proj,v_proj,down_proj", "--dtype", dtype, "--init-b", init, "--seed", "3"]  # fmt: skip
        assert main(argv) == 0
        made[init] = peft_logits(model, out, ids)
    random_logits, state = made["random"]
    zero_logits, _ = made["zero"]
    assert torch.equal(zero_logits, plain)  # B = 0: the update B·A·x is exactly zero
    assert not torch.allclose(random_logits, plain, atol=1e-3)
    # PEFT holds exactly the file's tensors under its own names (the adapter name inserted).
    saved = load_file(str(tmp_path / "random" / "adapter_model.safetensors"))
    assert len(saved) == 2 * 3 * 2
    for name, tensor in saved.items():
        loaded = state[name.replace(".weight", ".default.weight")]
        assert loaded.shape == tensor.shape
        assert torch.equal(loaded.to(tensor.dtype), tensor)
