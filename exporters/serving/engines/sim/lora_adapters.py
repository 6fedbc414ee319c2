"""LoRA adapters as the engine knows them: reading a PEFT ``adapter_config.json`` into a sized
:class:`~.scheduler.Adapter`, and the registry of served adapters (names, duplicate and rank checks, the
model cards). Where an adapter's weights live (host cache, GPU slots) is the scheduler's business."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporters.serving.engine import EngineError, ErrorKind, GenerationRequest, LoRARequest, ModelCard
from exporters.serving.engines.sim import roofline
from exporters.serving.engines.sim.sched_types import Adapter
from loadlens.contracts.model_profile import LINEAR_MODULES, ModelProfile

_ATTENTION = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})
"""Linear modules under ``self_attn`` in a Hugging Face Llama-style name (the rest are under ``mlp``)."""


def read_adapter(lora: LoRARequest, model: ModelProfile) -> Adapter:
    """Parse and size the adapter in ``lora.lora_path``; ``INVALID_REQUEST`` naming ``lora_path`` if bad."""
    name = lora.lora_name
    path = Path(lora.lora_path)
    config = path / "adapter_config.json"

    def bad(why: str) -> EngineError:
        return EngineError(ErrorKind.INVALID_REQUEST, f"Loading lora {name} failed: {why}", param="lora_path")

    if not config.is_file():
        raise bad(f"No adapter found for {path}")
    try:
        doc = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise bad(f"invalid adapter_config.json: {err}") from err
    if not isinstance(doc, dict):
        raise bad("adapter_config.json must hold a JSON object")
    rank = doc.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise bad(f"adapter_config.json field 'r' must be a positive integer, got {rank!r}")
    alpha = doc.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise bad(f"adapter_config.json field 'lora_alpha' must be a number, got {alpha!r}")
    modules = target_modules(doc.get("target_modules"), model, bad)
    params = roofline.adapter_params(model, rank, modules)
    return Adapter(
        name=name,
        int_id=lora.lora_int_id,
        path=str(path),
        rank=rank,
        alpha=float(alpha),
        target_modules=modules,
        params=params,
        nbytes=params * roofline.LORA_DTYPE_BYTES,
    )


def target_modules(raw: Any, model: ModelProfile, bad: Callable[[str], EngineError]) -> tuple[str, ...]:
    """PEFT's ``target_modules``: a list of (possibly dotted) names, ``"all-linear"``, or a regex that must
    match a full module name such as ``model.layers.0.self_attn.q_proj``. Returned in the model's order."""
    if isinstance(raw, str):
        if raw == "all-linear":
            return LINEAR_MODULES
        try:
            pattern = re.compile(raw)
        except re.error as err:
            raise bad(f"target_modules is not a valid regular expression: {err}") from err
        full = {m: f"model.layers.0.{'self_attn' if m in _ATTENTION else 'mlp'}.{m}" for m in LINEAR_MODULES}
        found = tuple(m for m in LINEAR_MODULES if pattern.fullmatch(full[m]) or pattern.fullmatch(m))
    elif isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
        unknown = sorted({x for x in raw if x.rsplit(".", 1)[-1] not in LINEAR_MODULES})
        if unknown:
            raise bad(f"target module {unknown[0]!r} is not a linear layer of {model.name} "
                      f"(known: {', '.join(LINEAR_MODULES)})")  # fmt: skip
        wanted = {x.rsplit(".", 1)[-1] for x in raw}
        found = tuple(m for m in LINEAR_MODULES if m in wanted)
    else:
        raise bad(f"adapter_config.json field 'target_modules' must be a list of names or a string, got {raw!r}")
    if not found:
        raise bad(f"target_modules {raw!r} matches no linear layer of {model.name}")
    return found


@dataclass(eq=False, slots=True)
class AdapterOp:
    """An adapter load waiting for the engine loop (``SimEngine.load_adapter``)."""

    adapter: Adapter
    enqueued: float
    done: asyncio.Future[None]


class AdapterRegistry:
    """The adapters served next to the base model, and the names whose load is under way (so a second
    load of the same name is refused while the first still blocks the loop)."""

    def __init__(self, model: ModelProfile, served_model_name: str) -> None:
        self.model = model
        self.served_model_name = served_model_name
        self._adapters: dict[str, Adapter] = {}
        self._loading: set[str] = set()

    def __len__(self) -> int:
        return len(self._adapters)

    def prepare(self, lora: LoRARequest, max_lora_rank: int) -> Adapter:
        """Check a load request and read its adapter; registers nothing."""
        name = lora.lora_name
        if name in self._adapters or name in self._loading or name == self.served_model_name:
            raise EngineError(
                ErrorKind.INVALID_REQUEST, f"The lora adapter '{name}' has already been loaded.", param="lora_name"
            )
        adapter = read_adapter(lora, self.model)
        if adapter.rank > max_lora_rank:
            raise EngineError(
                ErrorKind.INVALID_REQUEST,
                f"LoRA rank {adapter.rank} is greater than max_lora_rank {max_lora_rank}.",
                param="lora_path",
            )
        return adapter

    def start_loading(self, name: str) -> None:
        self._loading.add(name)

    def done_loading(self, name: str) -> None:
        self._loading.discard(name)

    def add(self, adapter: Adapter) -> None:
        self._adapters[adapter.name] = adapter

    def remove(self, name: str) -> Adapter:
        adapter = self._adapters.pop(name, None)
        if adapter is None:
            raise EngineError(ErrorKind.NOT_FOUND, f"The lora adapter '{name}' cannot be found.", param="lora_name")
        return adapter

    def resolve(self, request: GenerationRequest) -> Adapter | None:
        """The adapter a request asks for; None for the base model; ``NOT_FOUND`` for anything else."""
        name = request.lora.lora_name if request.lora is not None else request.model
        if request.lora is None and name == self.served_model_name:
            return None
        adapter = self._adapters.get(name)
        if adapter is None:
            raise EngineError(ErrorKind.NOT_FOUND, f"The model `{name}` does not exist.", param="model")
        return adapter

    def max_rank(self) -> int | None:
        return max((a.rank for a in self._adapters.values()), default=None)

    def cards(self) -> list[ModelCard]:
        """One card per adapter, in load-id order, with the base model as parent."""
        ordered = sorted(self._adapters.values(), key=lambda a: a.int_id)
        return [ModelCard(id=a.name, root=a.path, parent=self.served_model_name) for a in ordered]
