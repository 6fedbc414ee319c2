"""An experiment's ``adapters`` section and how trials use its adapters: the spec of an adapter (written with
``loadlens lora make``'s code before anything runs), an adapter after expansion, ``count`` copies of one
(``{i}`` = 1 ... count), a trial's ``adapter_count`` and its traffic shares ``adapter_weights`` (the profile's
``${adapter_mix}``, multi-lora). docs/experiments.md, *The experiment file*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from loadlens.experiment.errors import ExperimentError


class AdapterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    """A LoRA adapter the experiment writes with ``loadlens lora make`` before anything runs (into
    ``EXPDIR/adapters/NAME``) and trials load onto their server. With ``rank: "${PARAM}"`` (a list parameter)
    it is one adapter per rank, ``name`` holding ``{rank}``."""

    name: str
    """A template: ``r{rank}``."""
    rank: int | str = Field(default=8)
    alpha: float | None = Field(default=None, gt=0)
    """``lora_alpha``; default 2 x rank (``loadlens lora make``'s default)."""
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    init_b: Literal["random", "zero"] = "random"
    seed: int = 0
    count: int | str = Field(default=1)
    """Adapters alike but for their weights: a positive integer or ``"${PARAM}"``; with more than one the name
    holds ``{i}`` (1 ... count) and adapter i is seeded ``seed + i - 1``."""

    @field_validator("rank", "count")
    @classmethod
    def _rank(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be at least 1, got {value}")
        if isinstance(value, str) and not (value.startswith("${") and value.endswith("}")):
            raise ValueError(f"a positive integer or '${{PARAM}}', got {value!r}")
        return value


@dataclass(frozen=True)
class PlannedAdapter:
    """One adapter after expansion: its rank filled in."""

    name: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    dtype: str
    init_b: str
    seed: int


class _Named(Protocol):
    name: str
    count: int | str


def count_value(value: int | str, params: Mapping[str, Any], where: str) -> int:
    """A count field: a positive integer, or ``"${PARAM}"`` naming one."""
    got = params.get(value[2:-1]) if isinstance(value, str) else value
    if isinstance(got, bool) or not isinstance(got, int) or got < 1:
        raise ExperimentError(f"{where}: {value} must give a positive integer, got {got!r}")
    return got


def adapter_count(spec: _Named, params: Mapping[str, Any], where: str) -> int:
    """How many adapters an ``adapters`` entry stands for; above 1 its name must hold ``{i}``."""
    count = count_value(spec.count, params, f"{where}.count")
    if count > 1 and "{i}" not in spec.name:
        raise ExperimentError(f"{where}.name: {spec.name!r} must hold {{i}} (count {count})")
    return count


def indexed(entries: Sequence[str], count: int | str | None, scope: Mapping[str, Any], where: str) -> list[str]:
    """A trial's adapter entries with each one holding ``{i}`` repeated for i = 1 ... ``count`` (if given)."""
    if count is None:
        return list(entries)
    n = count_value(count, scope, where)
    return [e.replace("{i}", str(i)) for e in entries for i in (range(1, n + 1) if "{i}" in e else [0])]


def shares(adapters: tuple[str, ...], text: str, where: str) -> tuple[tuple[str, float], ...]:
    """A trial's traffic share per adapter from its filled ``adapter_weights``: comma-separated positive numbers,
    one per adapter, or ``""`` / ``equal`` for equal shares."""
    if not adapters:
        return ()
    text = text.strip()
    if text in ("", "equal"):
        return tuple((a, 1.0) for a in adapters)
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        raise ExperimentError(f"{where}.adapter_weights: {text!r}: give comma-separated numbers or 'equal'") from None
    if len(weights) != len(adapters) or any(not w > 0 for w in weights):
        raise ExperimentError(
            f"{where}.adapter_weights: {text!r}: give {len(adapters)} positive weights, one per adapter"
        )
    return tuple(zip(adapters, weights, strict=True))
