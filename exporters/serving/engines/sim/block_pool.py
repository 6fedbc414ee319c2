"""The KV-cache block pool behind the scheduler: counted blocks, prefix-cached ones by hash, LRU eviction.

Prefix-cached blocks also carry what vLLM's KV-cache residency metrics (``--kv-cache-metrics``) sample: when
the block entered the cache, its last :data:`ACCESSES_KEPT` accesses, and, when it is evicted to make room,
its lifetime, its idle time since the last access and the gaps between its kept accesses (reported to
``on_evict``). Instants are ``time.monotonic()`` wall clock, like every other sim latency.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from exporters.serving.engines.sim.sched_types import Block, SchedRequest

ACCESSES_KEPT = 4
"""Access instants kept per block (vLLM keeps a ring of its most recent accesses)."""

EvictionHook = Callable[[float, float, Sequence[float]], None]
"""(lifetime seconds, idle seconds before eviction, reuse gaps in seconds) of one evicted cached block."""


class BlockPool:
    """Counts blocks rather than naming them: only prefix-cached blocks need an identity."""

    def __init__(
        self, num_blocks: int, *, enable_caching: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.num_used = 0
        self._cached: dict[int, Block] = {}
        self._evictable: OrderedDict[int, Block] = OrderedDict()
        self.clock = clock
        self.on_evict: EvictionHook | None = None

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take: never used, or cached but unreferenced (evicted on demand)."""
        return self.num_blocks - self.num_used

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return self.num_used / self.num_blocks if self.num_blocks else 0.0

    def lookup(self, hashes: tuple[int, ...], max_blocks: int) -> list[Block]:
        hits: list[Block] = []
        if not self.enable_caching:
            return hits
        for h in hashes[:max_blocks]:
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def touch(self, blocks: Iterable[Block]) -> None:
        now = self.clock() if self.on_evict is not None else 0.0
        for block in blocks:
            if block.ref == 0:
                del self._evictable[block.hash]
                self.num_used += 1
            block.ref += 1
            if self.on_evict is not None:
                _accessed(block, now)

    def allocate(self, n: int) -> bool:
        if n > self.num_free:
            return False
        never_used = self.num_blocks - self.num_used - len(self._evictable)
        for _ in range(n - never_used):
            self._evict_oldest()
        self.num_used += n
        return True

    def _evict_oldest(self) -> None:
        h, block = self._evictable.popitem(last=False)
        del self._cached[h]
        hook = self.on_evict
        if hook is not None and block.accesses:
            now = self.clock()
            acc = block.accesses
            hook(now - block.born, now - acc[-1], [b - a for a, b in zip(acc, acc[1:], strict=False)])

    def promote(self, block_hash: int) -> Block | None:
        """Register one of a request's anonymous (already counted) blocks under ``block_hash``."""
        if not self.enable_caching or block_hash in self._cached:
            return None
        block = Block(block_hash, ref=1)
        if self.on_evict is not None:
            block.born = self.clock()
            block.accesses.append(block.born)
        self._cached[block_hash] = block
        return block

    def release(self, req: SchedRequest) -> None:
        self.num_used -= req.blocks_held - len(req.cached_blocks)
        # Tail first, so a request's last blocks are evicted before its shared head.
        for block in reversed(req.cached_blocks):
            block.ref -= 1
            if block.ref == 0:
                self.num_used -= 1
                self._evictable[block.hash] = block
        req.blocks_held = 0
        req.cached_blocks = []

    def resize(self, num_blocks: int) -> None:
        """Change the capacity; callers preempt first so that ``num_used`` fits."""
        if self.num_used > num_blocks:
            raise ValueError(f"{self.num_used} blocks in use do not fit in {num_blocks}")
        self.num_blocks = num_blocks
        while self.num_used + len(self._evictable) > num_blocks:
            self._evict_oldest()

    def reset_cache(self, enable: bool) -> None:
        """Forget unreferenced cached blocks (turning prefix caching off or on)."""
        for h in list(self._evictable):
            del self._cached[h]
        self._evictable.clear()
        self.enable_caching = enable


def _accessed(block: Block, now: float) -> None:
    acc = block.accesses
    acc.append(now)
    if len(acc) > ACCESSES_KEPT:
        del acc[0]
