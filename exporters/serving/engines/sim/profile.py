"""Model and GPU profiles: the sim's hardware and model descriptions, kept as YAML data.

Packaged profiles live in ``profiles/gpus/*.yaml`` and ``profiles/models/*.yaml`` next to this module; a user
passes a name (``h100-sxm``) or a path to their own file. Validation is strict: an unknown key, a missing key
or a value out of range raises :class:`ProfileError` with one line naming the file and the field::

    gpu = load_gpu_profile("h100-sxm")
    model = load_model_profile("./my-model.yaml")
    list_profiles()   # {"gpus": [...], "models": [...]}

Numbers may be written in YAML scientific notation without a dot (``312e12``): PyYAML reads those as strings,
so numeric fields accept numeric strings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import yaml

PROFILE_DIR = Path(__file__).with_name("profiles")
GPU_DIR = PROFILE_DIR / "gpus"
MODEL_DIR = PROFILE_DIR / "models"

Dtype = Literal["bf16", "fp16", "awq-4bit"]
DTYPES: tuple[str, ...] = ("bf16", "fp16", "awq-4bit")
# Linear-layer names a LoRA adapter may target, as PEFT and vLLM spell them for Llama-like models.
LINEAR_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# How far the declared parameter count may stray from what the shape implies before it is called a typo.
PARAMS_TOLERANCE = 0.2


class ProfileError(ValueError):
    """A profile is unknown, unreadable or invalid. The message is one line naming the file and field."""


@dataclass(frozen=True, slots=True)
class Thermal:
    ambient_celsius: float
    thermal_resistance_c_per_w: float
    """Steady-state rise above ambient per watt drawn."""
    time_constant_seconds: float
    """First-order lag of the die temperature."""
    memory_offset_celsius: float
    """HBM runs this much hotter than the GPU die at the same power."""
    slowdown_celsius: float
    """Above this the driver reports ``sw_thermal_slowdown`` and lowers clocks."""


@dataclass(frozen=True, slots=True)
class GPUProfile:
    name: str
    marketing_name: str
    source: str
    memory_bytes: int
    driver_reserved_bytes: int
    cuda_context_bytes: int
    """CUDA context, cuBLAS workspaces and CUDA graphs: memory outside PyTorch's allocator."""
    peak_tensor_flops: float
    """Dense BF16/FP16 tensor-core FLOP/s (no sparsity)."""
    vector_flops: float
    """FP32 CUDA-core FLOP/s (non-tensor): used for AWQ dequantisation."""
    hbm_bytes_per_s: float
    compute_efficiency: float
    memory_efficiency: float
    power_idle_watts: float
    power_limit_watts: float
    power_full_load_watts: float
    """What a fully busy, compute-bound GPU would draw uncapped; above the limit it is capped (sw_power_cap)."""
    max_sm_clock_hz: float
    idle_sm_clock_hz: float
    memory_clock_hz: float
    host_to_device_bytes_per_s: float
    adapter_read_bytes_per_s: float
    """Storage to host for a LoRA adapter's safetensors (page cache cold)."""
    adapter_load_fixed_seconds: float
    step_overhead_seconds: float
    """Host time per engine step (scheduling, input preparation, sampling): the GPU idles meanwhile."""
    per_seq_overhead_seconds: float
    layer_overhead_seconds: float
    """Kernel launch cost per layer per step (small: CUDA graphs)."""
    lora_kernel_overhead_seconds: float
    """Launch cost of one LoRA shrink+expand pair per target module per layer, per distinct adapter."""
    lora_compute_efficiency: float
    """Tensor-core efficiency of LoRA matmuls at rank 16; small ranks are launch/latency bound."""
    thermal: Thermal
    default_knobs: Mapping[str, Any] = field(default_factory=dict)
    path: str = ""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    source: str
    hf_repo: str
    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_word_embeddings: bool
    max_model_len: int
    dtype: Dtype
    image_tokens_per_image: int
    vision_params: int
    vision_flops_per_image: float
    mean_natural_output_tokens: int
    default_knobs: Mapping[str, Any] = field(default_factory=dict)
    path: str = ""

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


# --- loading ------------------------------------------------------------------------------------------------


def list_profiles() -> dict[str, list[str]]:
    """Names of the packaged profiles: ``{"gpus": [...], "models": [...]}``."""
    return {"gpus": _names(GPU_DIR), "models": _names(MODEL_DIR)}


def load_gpu_profile(name_or_path: str) -> GPUProfile:
    path = _resolve(name_or_path, GPU_DIR, "GPU")
    return _parse_gpu(_read(path), str(path))


def load_model_profile(name_or_path: str) -> ModelProfile:
    path = _resolve(name_or_path, MODEL_DIR, "model")
    return _parse_model(_read(path), str(path))


def _names(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def _resolve(name_or_path: str, directory: Path, kind: str) -> Path:
    looks_like_path = "/" in name_or_path or name_or_path.endswith((".yaml", ".yml"))
    if looks_like_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise ProfileError(f"{kind} profile file {name_or_path}: not found")
        return path
    path = directory / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(_names(directory))
        raise ProfileError(f"unknown {kind} profile {name_or_path!r} (known: {known}; or pass a YAML path)")
    return path


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ProfileError(f"profile {path}: cannot read: {err.strerror}") from err
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ProfileError(f"profile {path}: invalid YAML{line}") from err
    if not isinstance(doc, dict):
        raise ProfileError(f"profile {path}: expected a mapping of fields, got {type(doc).__name__}")
    return doc


class _Fields:
    """Typed, strict access to one YAML mapping; every failure names the file and field."""

    def __init__(self, doc: Mapping[str, Any], path: str, prefix: str = "") -> None:
        self.doc = doc
        self.path = path
        self.prefix = prefix
        self.used: set[str] = set()

    def fail(self, key: str, why: str) -> ProfileError:
        return ProfileError(f"profile {self.path}: field '{self.prefix}{key}': {why}")

    def _get(self, key: str, default: Any = ..., *, optional: bool = False) -> Any:
        self.used.add(key)
        if key not in self.doc or self.doc[key] is None:
            if default is not ... or optional:
                return None if default is ... else default
            raise self.fail(key, "missing")
        return self.doc[key]

    def text(self, key: str, default: str | None = None) -> str:
        value = self._get(key, ... if default is None else default)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        return value

    def number(self, key: str, *, minimum: float = 0.0, strict: bool = True, maximum: float = math.inf) -> float:
        value = self._get(key)
        if isinstance(value, bool):
            raise self.fail(key, f"must be a number, got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise self.fail(key, f"must be a number, got {value!r}") from None
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(key, f"must be a finite number, got {value!r}")
        if value < minimum or (strict and value == minimum) or value > maximum:
            low = f"> {minimum}" if strict else f">= {minimum}"
            high = "" if maximum == math.inf else f" and <= {maximum}"
            raise self.fail(key, f"must be {low}{high}, got {value!r}")
        return float(value)

    def integer(self, key: str, *, minimum: int = 1, default: int | None = None) -> int:
        value = self._get(key, ... if default is None else default)
        if isinstance(value, str):
            try:
                as_float = float(value)
            except ValueError:
                raise self.fail(key, f"must be an integer, got {value!r}") from None
            value = int(as_float) if as_float.is_integer() else value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self._get(key)
        if value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return cast(str, value)

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self._get(key, {})
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise self.fail(key, "must be a mapping of names to values")
        return cast(Mapping[str, Any], value)

    def nested(self, key: str) -> _Fields:
        value = self._get(key)
        if not isinstance(value, dict):
            raise self.fail(key, "must be a mapping")
        return _Fields(value, self.path, f"{self.prefix}{key}.")

    def finish(self) -> None:
        unknown = sorted(set(self.doc) - self.used)
        if unknown:
            raise self.fail(str(unknown[0]), "unknown field (check the spelling; see docs/sim-engine.md)")


def _parse_gpu(doc: Mapping[str, Any], path: str) -> GPUProfile:
    f = _Fields(doc, path)
    t = f.nested("thermal")
    thermal = Thermal(
        ambient_celsius=t.number("ambient_celsius", minimum=-40, strict=False),
        thermal_resistance_c_per_w=t.number("thermal_resistance_c_per_w"),
        time_constant_seconds=t.number("time_constant_seconds"),
        memory_offset_celsius=t.number("memory_offset_celsius", minimum=-50, strict=False),
        slowdown_celsius=t.number("slowdown_celsius"),
    )
    t.finish()
    gpu = GPUProfile(
        name=f.text("name"),
        marketing_name=f.text("marketing_name"),
        source=f.text("source"),
        memory_bytes=f.integer("memory_bytes"),
        driver_reserved_bytes=f.integer("driver_reserved_bytes", minimum=0),
        cuda_context_bytes=f.integer("cuda_context_bytes", minimum=0),
        peak_tensor_flops=f.number("peak_tensor_flops"),
        vector_flops=f.number("vector_flops"),
        hbm_bytes_per_s=f.number("hbm_bytes_per_s"),
        compute_efficiency=f.number("compute_efficiency", maximum=1.0),
        memory_efficiency=f.number("memory_efficiency", maximum=1.0),
        power_idle_watts=f.number("power_idle_watts"),
        power_limit_watts=f.number("power_limit_watts"),
        power_full_load_watts=f.number("power_full_load_watts"),
        max_sm_clock_hz=f.number("max_sm_clock_hz"),
        idle_sm_clock_hz=f.number("idle_sm_clock_hz"),
        memory_clock_hz=f.number("memory_clock_hz"),
        host_to_device_bytes_per_s=f.number("host_to_device_bytes_per_s"),
        adapter_read_bytes_per_s=f.number("adapter_read_bytes_per_s"),
        adapter_load_fixed_seconds=f.number("adapter_load_fixed_seconds", strict=False),
        step_overhead_seconds=f.number("step_overhead_seconds", strict=False),
        per_seq_overhead_seconds=f.number("per_seq_overhead_seconds", strict=False),
        layer_overhead_seconds=f.number("layer_overhead_seconds", strict=False),
        lora_kernel_overhead_seconds=f.number("lora_kernel_overhead_seconds", strict=False),
        lora_compute_efficiency=f.number("lora_compute_efficiency", maximum=1.0),
        thermal=thermal,
        default_knobs=dict(f.mapping("default_knobs")),
        path=path,
    )
    f.finish()
    _check(gpu.driver_reserved_bytes + gpu.cuda_context_bytes < gpu.memory_bytes, f, "driver_reserved_bytes",
           "driver reservation plus CUDA context must be smaller than memory_bytes")  # fmt: skip
    _check(gpu.power_idle_watts < gpu.power_limit_watts, f, "power_idle_watts", "must be below power_limit_watts")
    _check(gpu.idle_sm_clock_hz <= gpu.max_sm_clock_hz, f, "idle_sm_clock_hz", "must be <= max_sm_clock_hz")
    _check(gpu.thermal.slowdown_celsius > gpu.thermal.ambient_celsius, f, "thermal.slowdown_celsius",
           "must be above ambient_celsius")  # fmt: skip
    return gpu


def _parse_model(doc: Mapping[str, Any], path: str) -> ModelProfile:
    f = _Fields(doc, path)
    name = f.text("name")
    heads = f.integer("heads")
    hidden = f.integer("hidden")
    model = ModelProfile(
        name=name,
        source=f.text("source"),
        hf_repo=f.text("hf_repo", default=name),
        params=f.integer("params"),
        layers=f.integer("layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=f.integer("kv_heads"),
        head_dim=f.integer("head_dim", default=max(1, hidden // heads)),
        intermediate=f.integer("intermediate"),
        vocab=f.integer("vocab"),
        tie_word_embeddings=f.boolean("tie_word_embeddings", False),
        max_model_len=f.integer("max_model_len", minimum=16),
        dtype=cast(Dtype, f.choice("dtype", DTYPES)),
        image_tokens_per_image=f.integer("image_tokens_per_image", minimum=0, default=0),
        vision_params=f.integer("vision_params", minimum=0, default=0),
        vision_flops_per_image=_optional_number(f, "vision_flops_per_image"),
        mean_natural_output_tokens=f.integer("mean_natural_output_tokens", default=256),
        default_knobs=dict(f.mapping("default_knobs")),
        path=path,
    )
    f.finish()
    _check(model.heads % model.kv_heads == 0, f, "kv_heads", f"must divide heads ({model.heads})")
    implied = model.shape_params()
    _check(
        abs(model.params - implied) <= PARAMS_TOLERANCE * implied,
        f,
        "params",
        f"{model.params:.4g} is more than {PARAMS_TOLERANCE:.0%} away from the {implied:.4g} implied by "
        "layers, hidden, heads, kv_heads, head_dim, intermediate, vocab and vision_params",
    )
    _check(
        model.image_tokens_per_image > 0 or model.vision_flops_per_image == 0,
        f,
        "vision_flops_per_image",
        "set image_tokens_per_image too (a model without image tokens has no vision tower)",
    )
    return model


def _optional_number(f: _Fields, key: str) -> float:
    if f.doc.get(key) is None:
        f.used.add(key)
        return 0.0
    return f.number(key, strict=False)


def _check(ok: bool, f: _Fields, key: str, why: str) -> None:
    if not ok:
        raise f.fail(key, why)
