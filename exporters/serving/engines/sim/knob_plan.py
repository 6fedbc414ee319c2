"""Knobs against a model and a GPU: resolving them at start-up, validating a run-time change as a whole
(nothing is applied until every check passed), and the scheduler limits they set.

Applying a validated change to the scheduler is :meth:`~.scheduler.Scheduler.reconfigure`'s job, which keeps
the scheduler's invariants; :mod:`.knobs` checks each knob and the ones that depend on each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporters.serving.engine import EngineError, ErrorKind
from exporters.serving.engines.sim.knobs import STARTUP_ONLY, Knobs, coerce, merge
from exporters.serving.engines.sim.kv_sizing import blocks_for, require_kv_room
from exporters.serving.engines.sim.profile import GPUProfile
from exporters.serving.engines.sim.sched_types import Policy, SchedulerConfig
from loadlens.contracts.model_profile import ModelProfile
from loadlens.contracts.profile_schema import ProfileError


@dataclass(frozen=True, slots=True)
class KnobState:
    knobs: Knobs
    """``num_gpu_blocks`` is the effective KV-cache size."""
    override: int | None
    """The ``num_gpu_blocks`` the user set (vLLM's ``num_gpu_blocks_override``); None when derived from
    ``gpu_memory_utilization``."""


def startup_state(model: ModelProfile, gpu: GPUProfile, knobs: Mapping[str, Any] | None) -> KnobState:
    """Defaults < GPU profile ``default_knobs`` < model profile ``default_knobs`` < ``knobs``."""
    k = Knobs(mean_natural_output_tokens=model.mean_natural_output_tokens, max_model_len=model.max_model_len)
    k = _profile_knobs(k, gpu.default_knobs, gpu.path)
    k = _profile_knobs(k, model.default_knobs, model.path)
    if knobs:
        k = merge(k, knobs)
    if k.max_model_len > model.max_model_len:
        raise EngineError(
            ErrorKind.INVALID_REQUEST,
            f"knob max_model_len: {k.max_model_len} exceeds the model's context length {model.max_model_len}",
            param="max_model_len",
        )
    require_kv_room(model, gpu, k)
    override = k.num_gpu_blocks
    blocks = blocks_for(model, gpu, k, override, param="num_gpu_blocks" if override else "max_model_len")
    return KnobState(dataclasses.replace(k, num_gpu_blocks=blocks), override)


def startup_knobs(gpu: GPUProfile) -> Knobs:
    """The knobs a sim on ``gpu`` starts with before any model profile or user setting: the defaults and the GPU
    profile's ``default_knobs`` (a card's own scheduler limits, as vLLM picks them per card)."""
    return _profile_knobs(Knobs(), gpu.default_knobs, gpu.path)


def plan_change(
    state: KnobState,
    changes: Mapping[str, Any],
    model: ModelProfile,
    gpu: GPUProfile,
    *,
    max_adapter_rank: int | None,
) -> KnobState:
    """The state after ``changes``, or the first ``EngineError`` naming the bad knob. ``max_adapter_rank`` is
    the largest rank of a loaded adapter (``max_lora_rank`` may not drop below it)."""
    if not isinstance(changes, Mapping):
        raise EngineError(ErrorKind.INVALID_REQUEST, "knob changes must be a mapping of names to values")
    current = state.knobs
    for name in changes:
        if name in STARTUP_ONLY and coerce(name, changes[name]) != getattr(current, name):
            raise EngineError(
                ErrorKind.INVALID_REQUEST,
                f"knob {name}: start-up only; restart the server with --knob {name}=N",
                param=name,
            )
    new = merge(dataclasses.replace(current, num_gpu_blocks=state.override), changes)
    # The KV cache is sized only when asked to (other knobs never resize it behind the user's back).
    override = state.override
    blocks = current.num_gpu_blocks or 0
    if "num_gpu_blocks" in changes:
        override = new.num_gpu_blocks
        blocks = blocks_for(model, gpu, new, override, param="num_gpu_blocks")
    elif "gpu_memory_utilization" in changes:
        override = None
        blocks = blocks_for(model, gpu, new, None, param="gpu_memory_utilization")
    if max_adapter_rank is not None and new.max_lora_rank < max_adapter_rank:
        raise EngineError(
            ErrorKind.INVALID_REQUEST,
            f"knob max_lora_rank: {new.max_lora_rank} is below the rank {max_adapter_rank} of a loaded adapter",
            param="max_lora_rank",
        )
    return KnobState(dataclasses.replace(new, num_gpu_blocks=blocks), override)


def scheduler_config(k: Knobs) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_seqs=k.max_num_seqs,
        max_num_batched_tokens=k.max_num_batched_tokens,
        enable_chunked_prefill=k.enable_chunked_prefill,
        policy=Policy(k.scheduling_policy),
        max_loras=k.max_loras,
        max_cpu_loras=k.effective_max_cpu_loras,
    )


def _profile_knobs(k: Knobs, defaults: Mapping[str, Any], path: str) -> Knobs:
    if not defaults:
        return k
    try:
        return merge(k, defaults)
    except EngineError as err:
        raise ProfileError(f"profile {path}: field 'default_knobs.{err.param}': {err.message}") from err
