"""Model and GPU profiles: the sim's hardware and model descriptions, kept as YAML data.

Packaged profiles live in ``profiles/gpus/*.yaml`` and ``profiles/models/*.yaml`` next to this module; a user
passes a name (``h100-sxm``) or a path to their own file (``loadlens/util/packaged.py``: a value with a ``/``
or a ``.yaml`` suffix is a path). The profiles are pydantic models and validation is strict: an unknown key, a
missing key or a value out of range raises :class:`ProfileError` with one line naming the file, the line and
the field::

    gpu = load_gpu_profile("h100-sxm")
    model = load_model_profile("./my-model.yaml")
    list_profiles()   # {"gpus": [...], "models": [...]}

A null value is the same as an absent key. Numbers may be written in YAML scientific notation without a dot
(``312e12``): PyYAML reads those as strings, so numeric fields accept numeric strings.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator
from pydantic_core import PydanticCustomError

from loadlens.contracts.yaml_document import Document, DocumentInvalid, Problem, fail, parse_yaml, yaml_error_line
from loadlens.util.packaged import UnknownName, packaged_names, resolve_packaged

PROFILE_DIR = Path(__file__).with_name("profiles")
GPU_DIR = PROFILE_DIR / "gpus"
MODEL_DIR = PROFILE_DIR / "models"

P = TypeVar("P", bound="_ProfileFile")
Dtype = Literal["bf16", "fp16", "awq-4bit"]
DTYPES: tuple[str, ...] = ("bf16", "fp16", "awq-4bit")
# Linear-layer names a LoRA adapter may target, as PEFT and vLLM spell them for Llama-like models.
LINEAR_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# How far the declared parameter count may stray from what the shape implies before it is called a typo.
PARAMS_TOLERANCE = 0.2


class ProfileError(ValueError):
    """A profile is unknown, unreadable or invalid. The message is one line naming the file and field."""


# --- field types: each check words its reason as docs/sim-engine.md shows ----------------------------------------


def _number(minimum: float = 0.0, *, strict: bool = True, maximum: float = math.inf) -> BeforeValidator:
    """A finite number above ``minimum`` (at or above it unless ``strict``) and at most ``maximum``."""

    def check(value: Any) -> float:
        if isinstance(value, bool):
            raise fail(f"must be a number, got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise fail(f"must be a number, got {value!r}") from None
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise fail(f"must be a finite number, got {value!r}")
        if value < minimum or (strict and value == minimum) or value > maximum:
            low = f"> {minimum}" if strict else f">= {minimum}"
            high = "" if maximum == math.inf else f" and <= {maximum}"
            raise fail(f"must be {low}{high}, got {value!r}")
        return float(value)

    return BeforeValidator(check)


def _whole_number(value: Any) -> int:
    """``4096``, ``4096.0`` and ``"4e3"`` are whole numbers; anything else is refused."""
    if isinstance(value, str):
        try:
            as_float = float(value)
        except ValueError:
            raise fail(f"must be an integer, got {value!r}") from None
        value = int(as_float) if as_float.is_integer() else value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(f"must be an integer, got {value!r}")
    return int(value)


def _integer(minimum: int = 1) -> BeforeValidator:
    """A whole number >= ``minimum``."""

    def check(value: Any) -> int:
        whole = _whole_number(value)
        if whole < minimum:
            raise fail(f"must be >= {minimum}, got {whole}")
        return whole

    return BeforeValidator(check)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise fail(f"must be a non-empty string, got {value!r}")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(f"must be true or false, got {value!r}")
    return value


def _choice(choices: tuple[str, ...]) -> BeforeValidator:
    def check(value: Any) -> str:
        if value not in choices:
            raise fail(f"must be one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return BeforeValidator(check)


def _knobs(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise fail("must be a mapping of names to values")
    return value


Positive = Annotated[float, _number()]
NonNegative = Annotated[float, _number(strict=False)]
Fraction = Annotated[float, _number(maximum=1.0)]
Count = Annotated[int, _integer()]
Text = Annotated[str, BeforeValidator(_text)]
Flag = Annotated[bool, BeforeValidator(_boolean)]
KnobDefaults = Annotated[dict[str, Any], BeforeValidator(_knobs)]


class _ProfileModel(BaseModel):
    """A mapping of a profile file: null is absent, and a key that is no field is a misspelling (reported after
    the fields' own mistakes, before the checks across fields)."""

    model_config = ConfigDict(frozen=True, extra="allow", use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise fail("must be a mapping")
        return cls._defaults({k: v for k, v in value.items() if v is not None or k not in cls.model_fields})

    @classmethod
    def _defaults(cls, fields: dict[str, Any]) -> dict[str, Any]:
        """Defaults that depend on other fields, filled in before validation."""
        return fields

    @model_validator(mode="after")
    def _complete(self) -> Self:
        unknown = sorted(str(k) for k in self.model_extra or {})
        if unknown:
            raise fail("unknown field (check the spelling; see docs/sim-engine.md)", unknown[0])
        self._consistent()
        return self

    def _consistent(self) -> None:
        """Checks across fields (each names the field it blames)."""


class _ProfileFile(_ProfileModel):
    """A whole profile file: remembers where it was loaded from."""

    _path: str = PrivateAttr("")

    @property
    def path(self) -> str:
        """The file it was loaded from (set by the loader)."""
        return self._path


def _require(ok: bool, key: str, why: str) -> None:
    """A check across fields: the reason is reported at ``key`` (dotted for a nested field)."""
    if not ok:
        raise fail(why, *key.split("."))


class Thermal(_ProfileModel):
    ambient_celsius: Annotated[float, _number(-40, strict=False)]
    thermal_resistance_c_per_w: Positive
    """Steady-state rise above ambient per watt drawn."""
    time_constant_seconds: Positive
    """First-order lag of the die temperature."""
    memory_offset_celsius: Annotated[float, _number(-50, strict=False)]
    """HBM runs this much hotter than the GPU die at the same power."""
    slowdown_celsius: Positive
    """Above this the driver reports ``sw_thermal_slowdown`` and lowers clocks."""


class GPUProfile(_ProfileFile):
    name: Text
    marketing_name: Text
    source: Text
    memory_bytes: Count
    driver_reserved_bytes: Annotated[int, _integer(0)]
    cuda_context_bytes: Annotated[int, _integer(0)]
    """CUDA context, cuBLAS workspaces and CUDA graphs: memory outside PyTorch's allocator."""
    peak_tensor_flops: Positive
    """Dense BF16/FP16 tensor-core FLOP/s (no sparsity)."""
    vector_flops: Positive
    """FP32 CUDA-core FLOP/s (non-tensor): used for AWQ dequantisation."""
    hbm_bytes_per_s: Positive
    compute_efficiency: Fraction
    memory_efficiency: Fraction
    power_idle_watts: Positive
    power_limit_watts: Positive
    power_full_load_watts: Positive
    """What a fully busy, compute-bound GPU would draw uncapped; above the limit it is capped (sw_power_cap)."""
    max_sm_clock_hz: Positive
    idle_sm_clock_hz: Positive
    memory_clock_hz: Positive
    host_to_device_bytes_per_s: Positive
    adapter_read_bytes_per_s: Positive
    """Storage to host for a LoRA adapter's safetensors (page cache cold)."""
    adapter_load_fixed_seconds: NonNegative
    step_overhead_seconds: NonNegative
    """Host time per engine step (scheduling, input preparation, sampling): the GPU idles meanwhile."""
    per_seq_overhead_seconds: NonNegative
    layer_overhead_seconds: NonNegative
    """Kernel launch cost per layer per step (small: CUDA graphs)."""
    lora_kernel_overhead_seconds: NonNegative
    """Launch cost of one LoRA shrink+expand pair per target module per layer, per distinct adapter."""
    lora_compute_efficiency: Fraction
    """Tensor-core efficiency of LoRA matmuls at rank 16; small ranks are launch/latency bound."""
    thermal: Thermal
    default_knobs: KnobDefaults = Field(default_factory=dict)

    def _consistent(self) -> None:
        _require(self.driver_reserved_bytes + self.cuda_context_bytes < self.memory_bytes, "driver_reserved_bytes",
                 "driver reservation plus CUDA context must be smaller than memory_bytes")  # fmt: skip
        _require(self.power_idle_watts < self.power_limit_watts, "power_idle_watts", "must be below power_limit_watts")
        _require(self.idle_sm_clock_hz <= self.max_sm_clock_hz, "idle_sm_clock_hz", "must be <= max_sm_clock_hz")
        _require(self.thermal.slowdown_celsius > self.thermal.ambient_celsius, "thermal.slowdown_celsius",
                 "must be above ambient_celsius")  # fmt: skip


class ModelProfile(_ProfileFile):
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
    max_model_len: Annotated[int, _integer(16)]
    dtype: Annotated[Dtype, _choice(DTYPES)]
    image_tokens_per_image: Annotated[int, _integer(0)] = 0
    vision_params: Annotated[int, _integer(0)] = 0
    vision_flops_per_image: NonNegative = 0.0
    mean_natural_output_tokens: Count = 256
    default_knobs: KnobDefaults = Field(default_factory=dict)

    @classmethod
    def _defaults(cls, fields: dict[str, Any]) -> dict[str, Any]:
        if "hf_repo" not in fields and "name" in fields:
            fields["hf_repo"] = fields["name"]
        if "head_dim" not in fields:
            hidden, heads = _whole(fields.get("hidden")), _whole(fields.get("heads"))
            if hidden is not None and heads is not None and heads >= 1:
                fields["head_dim"] = max(1, hidden // heads)
        return fields

    def _consistent(self) -> None:
        _require(self.heads % self.kv_heads == 0, "kv_heads", f"must divide heads ({self.heads})")
        implied = self.shape_params()
        _require(
            abs(self.params - implied) <= PARAMS_TOLERANCE * implied,
            "params",
            f"{self.params:.4g} is more than {PARAMS_TOLERANCE:.0%} away from the {implied:.4g} implied by "
            "layers, hidden, heads, kv_heads, head_dim, intermediate, vocab and vision_params",
        )
        _require(
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
        dims = {
            "q_proj": (self.hidden, self.q_dim),
            "k_proj": (self.hidden, self.kv_dim),
            "v_proj": (self.hidden, self.kv_dim),
            "o_proj": (self.q_dim, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }
        return dims[module]

    def layer_linear_params(self) -> int:
        """Parameters of one decoder layer's linear modules (attention projections and the gated MLP)."""
        return sum(d_in * d_out for d_in, d_out in map(self.module_dims, LINEAR_MODULES))

    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tie_word_embeddings else 2)

    def shape_params(self) -> int:
        """Parameter count implied by the shape (norms ignored), vision tower included."""
        return self.layers * self.layer_linear_params() + self.embedding_params() + self.vision_params


def _whole(value: Any) -> int | None:
    """``value`` as the integer fields read it, or None (the field's own check then reports it)."""
    try:
        return _whole_number(value)
    except PydanticCustomError:
        return None


# --- loading ------------------------------------------------------------------------------------------------


def list_profiles() -> dict[str, list[str]]:
    """Names of the packaged profiles: ``{"gpus": [...], "models": [...]}``."""
    return {"gpus": packaged_names(GPU_DIR), "models": packaged_names(MODEL_DIR)}


def load_gpu_profile(name_or_path: str) -> GPUProfile:
    return _load(name_or_path, GPU_DIR, "GPU", GPUProfile)


def load_model_profile(name_or_path: str) -> ModelProfile:
    return _load(name_or_path, MODEL_DIR, "model", ModelProfile)


def _load(name_or_path: str, directory: Path, kind: str, model: type[P]) -> P:
    try:
        path = resolve_packaged(name_or_path, directory, f"{kind} profile")
    except UnknownName as err:
        raise ProfileError(str(err)) from None
    doc = _read(path)
    try:
        profile = doc.validate(model)
    except DocumentInvalid as err:
        raise ProfileError(_message(err.problem)) from None
    profile._path = str(path)
    return profile


def _message(problem: Problem) -> str:
    """``profile FILE:LINE:COL: field 'F': reason``, the file's place written as in every loadlens document error."""
    return f"profile {problem.where}: field '{problem.field}': {problem.reason}"


def _read(path: Path) -> Document:
    try:
        doc = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    except OSError as err:
        raise ProfileError(f"profile {path}: cannot read: {err.strerror}") from err
    except yaml.YAMLError as err:
        line = yaml_error_line(err)
        raise ProfileError(f"profile {path}: invalid YAML{'' if line is None else f' at line {line}'}") from err
    if not isinstance(doc.data, dict):
        raise ProfileError(f"profile {path}: expected a mapping of fields, got {type(doc.data).__name__}")
    return doc
