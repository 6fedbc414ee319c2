"""The KV-cache block pool behind the scheduler: counted blocks, prefix-cached ones by hash, LRU eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from exporters.serving.engines.sim.sched_types import Block, SchedRequest


class BlockPool:
    """Counts blocks rather than naming them: only prefix-cached blocks need an identity."""

    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.num_used = 0
        self._cached: dict[int, Block] = {}
        self._evictable: OrderedDict[int, Block] = OrderedDict()

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
        for block in blocks:
            if block.ref == 0:
                del self._evictable[block.hash]
                self.num_used += 1
            block.ref += 1

    def allocate(self, n: int) -> bool:
        if n > self.num_free:
            return False
        never_used = self.num_blocks - self.num_used - len(self._evictable)
        for _ in range(n - never_used):
            h, _block = self._evictable.popitem(last=False)
            del self._cached[h]
        self.num_used += n
        return True

    def promote(self, block_hash: int) -> Block | None:
        """Register one of a request's anonymous (already counted) blocks under ``block_hash``."""
        if not self.enable_caching or block_hash in self._cached:
            return None
        block = Block(block_hash, ref=1)
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
            h, _block = self._evictable.popitem(last=False)
            del self._cached[h]

    def reset_cache(self, enable: bool) -> None:
        """Forget unreferenced cached blocks (turning prefix caching off or on)."""
        for h in list(self._evictable):
            del self._cached[h]
        self._evictable.clear()
        self.enable_caching = enable
