"""A tiny randomly initialised causal LM with PEFT LoRA, and synthetic token batches: nothing downloaded.

Shared by the demo and the tests. Llama-shaped (q/k/v/o projections, so LoRA targets q_proj and v_proj as
in guide 2.2/2.5) but small enough that a step takes milliseconds on one CPU core.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


def tiny_lora_model(*, seed: int = 0, rank: int = 8, alpha: int = 16, layers: int = 2, train_head: bool = False) -> Any:
    """A PEFT model: LlamaForCausalLM from a config (vocab 128, hidden 32, ``layers`` layers), LoRA on q/v.

    ``train_head`` also trains the LM head (PEFT's ``modules_to_save``, a common LoRA set-up). The demo needs
    it: with only q/v adapters behind RMSNorm, a learning-rate spike saturates attention and the gradient
    norm *falls*; a spiked head scales the gradient flowing back through it, so the norm jumps as in guide 2.3.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    base = LlamaForCausalLM(config)
    lora = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=["q_proj", "v_proj"],
        lora_dropout=0.0,
        modules_to_save=["lm_head"] if train_head else None,
    )
    with warnings.catch_warnings():
        # peft reads transformers' deprecated is_gradient_checkpointing (transformers >= 5.x warns): theirs.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        return get_peft_model(base, lora)


def synthetic_batches(
    n: int, *, batch_size: int = 4, seq_len: int = 16, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    """``n`` batches of a learnable pattern (each sequence counts up from a random start), labels = inputs."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start = torch.randint(0, 128, (batch_size, 1), generator=g)
        ids = (start + torch.arange(seq_len)) % 128
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def synthetic_examples(n: int, *, seq_len: int = 16, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` single examples (a Trainer's dataset: it batches them itself)."""
    return [{k: v[0] for k, v in b.items()} for b in synthetic_batches(n, batch_size=1, seq_len=seq_len, seed=seed)]
