"""Model profiles: a served model's shapes (layers, hidden size, heads, KV heads, head dim, intermediate size,
vocabulary) and serving facts, as YAML data. The sim prices its steps, KV cache and LoRA adapters from them;
``loadlens lora make`` sizes and writes adapters from the same shapes.

Packaged profiles live in ``model_profiles/*.yaml`` next to this module; a user passes a name (``tiny``) or a
path to their own file (``loadlens/contracts/packaged.py``: a value with a ``/`` or a ``.yaml`` suffix is a
path). Validation is strict (``loadlens/contracts/profile_schema.py``)::

    model = load_model_profile("deepseek-r1-distill-llama-8b")
    model.module_dims("q_proj")   # (d_in, d_out) of a linear module
    model_profile_names()         # ["deepseek-r1-distill-llama-8b", ...]
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from loadlens.contracts.packaged import packaged_names
from loadlens.contracts.profile_schema import (
    Count,
    Flag,
    KnobDefaults,
    NonNegative,
    ProfileFile,
    Text,
    choice,
    integer,
    load_profile,
    require,
    whole,
)

MODEL_DIR = Path(__file__).with_name("model_profiles")
Dtype = Literal["bf16", "fp16", "awq-4bit"]
DTYPES: tuple[str, ...] = ("bf16", "fp16", "awq-4bit")
# Linear-layer names a LoRA adapter may target, as PEFT and vLLM spell them for Llama-like models.
LINEAR_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# How far the declared parameter count may stray from what the shape implies before it is called a typo.
PARAMS_TOLERANCE = 0.2


class ModelProfile(ProfileFile):
    name: Text
    source: Text
    hf_repo: Text
    """Default: ``name``."""
    params: Count
    layers: Count
    hidden: Count
    heads: Count
    kv_heads: Count
    head_dim: Count
    """Default: ``hidden // heads``."""
    intermediate: Count
    vocab: Count
    tie_word_embeddings: Flag = False
    max_model_len: Annotated[int, integer(16)]
    dtype: Annotated[Dtype, choice(DTYPES)]
    image_tokens_per_image: Annotated[int, integer(0)] = 0
    vision_params: Annotated[int, integer(0)] = 0
    vision_flops_per_image: NonNegative = 0.0
    mean_natural_output_tokens: Count = 256
    default_knobs: KnobDefaults = Field(default_factory=dict)

    @classmethod
    def _defaults(cls, fields: dict[str, Any]) -> dict[str, Any]:
        if "hf_repo" not in fields and "name" in fields:
            fields["hf_repo"] = fields["name"]
        if "head_dim" not in fields:
            hidden, heads = whole(fields.get("hidden")), whole(fields.get("heads"))
            if hidden is not None and heads is not None and heads >= 1:
                fields["head_dim"] = max(1, hidden // heads)
        return fields

    def _consistent(self) -> None:
        require(self.heads % self.kv_heads == 0, "kv_heads", f"must divide heads ({self.heads})")
        implied = self.shape_params()
        require(
            abs(self.params - implied) <= PARAMS_TOLERANCE * implied,
            "params",
            f"{self.params:.4g} is more than {PARAMS_TOLERANCE:.0%} away from the {implied:.4g} implied by "
            "layers, hidden, heads, kv_heads, head_dim, intermediate, vocab and vision_params",
        )
        require(
            self.image_tokens_per_image > 0 or self.vision_flops_per_image == 0,
            "vision_flops_per_image",
            "set image_tokens_per_image too (a model without image tokens has no vision tower)",
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def module_dims(self, module: str) -> tuple[int, int]:
        """(d_in, d_out) of a linear module, for LoRA sizing."""
        return self._linear_dims()[module]

    def _linear_dims(self) -> dict[str, tuple[int, int]]:
        return {
            "q_proj": (self.hidden, self.q_dim),
            "k_proj": (self.hidden, self.kv_dim),
            "v_proj": (self.hidden, self.kv_dim),
            "o_proj": (self.q_dim, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }

    def layer_linear_params(self) -> int:
        """Parameters of one decoder layer's linear modules (attention projections and the gated MLP)."""
        dims = self._linear_dims()  # once: the sim asks it for every step it models
        return sum(dims[m][0] * dims[m][1] for m in LINEAR_MODULES)

    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tie_word_embeddings else 2)

    def shape_params(self) -> int:
        """Parameter count implied by the shape (norms ignored), vision tower included."""
        return self.layers * self.layer_linear_params() + self.embedding_params() + self.vision_params


def model_profile_names() -> list[str]:
    """Names of the packaged model profiles."""
    return packaged_names(MODEL_DIR)


def load_model_profile(name_or_path: str) -> ModelProfile:
    """A packaged model profile by name, or a profile YAML file; raises ``ProfileError`` (one line)."""
    return load_profile(name_or_path, MODEL_DIR, "model", ModelProfile)
