"""The sim engine's knobs: names, units, defaults and validation (all-or-nothing, naming the bad knob).

Precedence at start-up: these defaults < the GPU profile's ``default_knobs`` < the model profile's
``default_knobs`` < the constructor's ``knobs``. At run time ``set_knobs`` changes any of them except
``max_model_len``. See docs/sim-engine.md for what each one does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporters.serving.engine import EngineError, ErrorKind
from exporters.serving.engines.sim.roofline import BLOCK_SIZE

LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM's allowed ``max_lora_rank`` values."""
POLICIES: tuple[str, ...] = ("fcfs", "priority")
WINDOW_MODES: tuple[str, ...] = ("idle", "admission")
"""Where ``batching_window_us`` applies: only after idleness (the default), or before every admission."""
STARTUP_ONLY: frozenset[str] = frozenset({"max_model_len"})


@dataclass(frozen=True, slots=True)
class Knobs:
    max_num_seqs: int = 256
    """Most requests in one batch (vLLM ``--max-num-seqs``)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step (vLLM ``--max-num-batched-tokens``)."""
    enable_chunked_prefill: bool = True
    batching_window_us: float = 0.0
    """After the first arrival into an idle engine, wait this long (modeled µs) to fill the batch. vLLM has
    no such window (0); guide 4.1 sweeps 10-200 µs."""
    batching_window_mode: str = "idle"
    """``idle``: the window applies only after idleness. ``admission``: waiting requests join the running
    batch at most once per window: admission waits until ``batching_window_us`` has passed since the later
    of the oldest waiting arrival and the last admission (or until the waiting requests would fill a batch),
    while the running requests keep decoding."""
    insertion_overhead_us: float = 0.0
    """Modeled µs of host time added to every step that moves waiting requests into the batch (scheduling
    lock, input preparation, prefill launch). 0 = off (the default); guide 4.4 puts vLLM's at ~12 ms."""
    scheduling_policy: str = "fcfs"
    async_scheduling: bool = False
    """Plan each step while the one before it runs, as vLLM's async scheduling does (on by default in vLLM
    0.32's GPU builds, forced off in its CPU build): a request that arrives during a step waits for the step
    already planned, so it enters the batch one step later than with planning between steps."""
    max_waiting: int = 1024
    """Bound of the waiting queue (vLLM's max_num_queued_reqs); beyond it requests get QUEUE_FULL."""
    max_waiting_tokens: int = 0
    """Bound of prompt tokens waiting (vLLM's max_num_queued_tokens); 0 = unbounded."""
    max_loras: int = 1
    """GPU adapter slots = most distinct adapters in one batch (vLLM ``--max-loras``)."""
    max_cpu_loras: int | None = None
    """Host adapter cache; None = ``max_loras`` (vLLM's default)."""
    max_lora_rank: int = 16
    gpu_memory_utilization: float = 0.92
    num_gpu_blocks: int | None = None
    """KV-cache size in 16-token blocks. Reported as the effective size; setting it overrides the size
    derived from ``gpu_memory_utilization`` (vLLM's ``num_gpu_blocks_override``)."""
    enable_prefix_caching: bool = True
    mean_natural_output_tokens: int = 256
    """Mean of the output length when a request does not set ``ignore_eos`` (lognormal, capped by max_tokens)."""
    max_model_len: int = 2048
    """Context length; start-up only, at most the model's."""

    @property
    def effective_max_cpu_loras(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


KNOB_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Knobs))


def _bad(name: str, why: str) -> EngineError:
    return EngineError(ErrorKind.INVALID_REQUEST, f"knob {name}: {why}", param=name)


def _int(name: str, value: Any, low: int, high: int = 1 << 31) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise _bad(name, f"must be between {low} and {high}, got {value}")
    return value


def _float(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(name, f"must be a finite number, got {value!r}")
    if value < low or (low_open and value == low) or value > high:
        interval = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise _bad(name, f"must be in {interval}, got {value}")
    return float(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, f"must be true or false, got {value!r}")
    return value


def coerce(name: str, value: Any) -> Any:
    """Check one knob's type and range on its own."""
    if name not in KNOB_NAMES:
        raise _bad(name, f"unknown knob (known: {', '.join(KNOB_NAMES)})")
    match name:
        case "max_num_seqs" | "max_loras":
            return _int(name, value, 1, 65536)
        case "max_num_batched_tokens" | "max_waiting" | "mean_natural_output_tokens":
            return _int(name, value, 1, 1 << 24)
        case "max_waiting_tokens":
            return _int(name, value, 0, 1 << 40)
        case "max_model_len":
            return _int(name, value, BLOCK_SIZE, 1 << 24)
        case "max_cpu_loras" | "num_gpu_blocks":
            return None if value is None else _int(name, value, 1, 1 << 40)
        case "enable_chunked_prefill" | "enable_prefix_caching" | "async_scheduling":
            return _bool(name, value)
        case "batching_window_us" | "insertion_overhead_us":
            return _float(name, value, 0.0, 1e6)
        case "batching_window_mode":
            if value not in WINDOW_MODES:
                raise _bad(name, f"must be one of {', '.join(WINDOW_MODES)}, got {value!r}")
            return value
        case "gpu_memory_utilization":
            return _float(name, value, 0.0, 1.0, low_open=True)
        case "max_lora_rank":
            rank = _int(name, value, 1, 512)
            if rank not in LORA_RANKS:
                raise _bad(name, f"must be one of {', '.join(map(str, LORA_RANKS))}, got {rank}")
            return rank
        case "scheduling_policy":
            if value not in POLICIES:
                raise _bad(name, f"must be one of {', '.join(POLICIES)}, got {value!r}")
            return value
    raise AssertionError(name)  # pragma: no cover - every name has a case


def merge(current: Knobs, changes: Mapping[str, Any]) -> Knobs:
    """``current`` with ``changes`` applied, after checking each knob and the ones that depend on each other.
    Memory-dependent checks (does the KV cache fit?) are the engine's."""
    values = {name: coerce(name, value) for name, value in changes.items()}
    new = dataclasses.replace(current, **values)
    if new.max_num_batched_tokens < new.max_num_seqs:
        name = "max_num_batched_tokens" if "max_num_batched_tokens" in values else "max_num_seqs"
        raise _bad(name, f"max_num_batched_tokens ({new.max_num_batched_tokens}) must be >= max_num_seqs "
                         f"({new.max_num_seqs})")  # fmt: skip
    if not new.enable_chunked_prefill and new.max_num_batched_tokens < new.max_model_len:
        name = "enable_chunked_prefill" if "enable_chunked_prefill" in values else "max_num_batched_tokens"
        raise _bad(name, f"without chunked prefill max_num_batched_tokens ({new.max_num_batched_tokens}) must be "
                         f">= max_model_len ({new.max_model_len}), or long prompts could never run")  # fmt: skip
    if new.max_cpu_loras is not None and new.max_cpu_loras < new.max_loras:
        name = "max_cpu_loras" if "max_cpu_loras" in values else "max_loras"
        raise _bad(name, f"max_cpu_loras ({new.max_cpu_loras}) must be >= max_loras ({new.max_loras})")
    return new
