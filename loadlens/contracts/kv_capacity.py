"""A server's KV cache capacity as it states it: vLLM's ``vllm:cache_config_info`` info gauge, whose labels are
its ``CacheConfig`` (``num_gpu_blocks``, ``block_size``, ...). The experiment's ``/metrics`` sampler reads it
(loadlens/experiment/sampler.py) and ``loadlens calibrate`` writes it into the fitted profile
(docs/calibration.md): a capacity the server states is read, not fitted.

sglang has no counterpart series; a server without the series, or whose ``num_gpu_blocks`` label is not a
whole number (``None`` before the engine has profiled its memory), states no capacity (None, never 0).
With several engines (data-parallel ranks) each has its own cache; the smallest is taken, the one a request
can run out of.

Usage::

    capacity = parse_kv_capacity(exposition_text)   # KvCapacity(blocks=..., block_size=...) or None
    capacity.tokens
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from loadlens.contracts.exposition_labels import parse_labels

SERIES = "vllm:cache_config_info"


@dataclass(frozen=True, slots=True)
class KvCapacity:
    blocks: int
    """``num_gpu_blocks``: KV cache blocks of one engine."""
    block_size: int
    """Tokens per block."""

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size


def _whole(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def stated_capacity(label_sets: Iterable[Mapping[str, str]]) -> KvCapacity | None:
    """The capacity the label sets of ``vllm:cache_config_info`` state (the smallest engine's), or None: from
    an exposition (:func:`parse_kv_capacity`) or a Prometheus query's series."""
    found: list[KvCapacity] = []
    for labels in label_sets:
        blocks, size = _whole(labels.get("num_gpu_blocks")), _whole(labels.get("block_size"))
        if blocks is not None and size is not None:
            found.append(KvCapacity(blocks, size))
    return min(found, key=lambda c: c.tokens) if found else None


def parse_kv_capacity(text: str) -> KvCapacity | None:
    """The capacity ``vllm:cache_config_info`` states in one exposition (the smallest engine's), or None."""
    prefix = SERIES + "{"
    label_sets = []
    for line in text.splitlines():
        close = line.rfind("}")
        if line.startswith(prefix) and close > 0:
            label_sets.append(dict(parse_labels(line[len(prefix) : close])))
    return stated_capacity(label_sets)
