"""The KV capacity ``loadlens calibrate`` writes into the profile: the one the server stated in its
``vllm:cache_config_info`` during the stages (loadlens/contracts/kv_capacity.py), read, not fitted
(docs/calibration.md, *The profile written*). The sim's blocks hold ``BLOCK_SIZE`` tokens, so the server's
capacity is carried over in tokens: ``num_gpu_blocks`` = the server's tokens // the sim's block size."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exporters.serving.calibrate.observations import Stage
from exporters.serving.engines.sim.roofline import BLOCK_SIZE
from loadlens.contracts.kv_capacity import KvCapacity


@dataclass(frozen=True, slots=True)
class KvDecision:
    capacity: KvCapacity | None
    """What the server stated (every stage the same), or None."""
    sim_blocks: int | None
    """The profile's ``default_knobs.num_gpu_blocks``; None keeps what the base profile implies."""
    reason: str


def kv_decision(stages: Sequence[Stage]) -> KvDecision:
    """The capacity every stage's server stated, or why none is written."""
    stated = {s.kv_capacity for s in stages if s.kv_capacity is not None}
    silent = [s.name for s in stages if s.kv_capacity is None]
    if not stated:
        return KvDecision(None, None, "not stated by the server (no vllm:cache_config_info): the base profile's kept")
    if len(stated) > 1 or silent:
        seen = ", ".join(f"{c.blocks} x {c.block_size}" for c in sorted(stated, key=lambda c: c.tokens))
        more = f"; none in {', '.join(silent)}" if silent else ""
        return KvDecision(None, None, f"the stages state different capacities ({seen} tokens{more}): not one "
                          "server configuration, the base profile's kept")  # fmt: skip
    capacity = stated.pop()
    blocks = capacity.tokens // BLOCK_SIZE
    reason = (
        f"stated by the server: {capacity.blocks} blocks of {capacity.block_size} tokens = {capacity.tokens} "
        f"tokens, {blocks} of the sim's {BLOCK_SIZE}-token blocks"
    )
    return KvDecision(capacity, blocks, reason)
