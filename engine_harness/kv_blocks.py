"""KV block pool with a prefix cache keyed by chained block hashes, as in vLLM V1 (pure, no I/O).

A block holds ``block_size`` tokens. A *full* block's hash chains the previous block's hash with its own
token ids, so a hash names the whole prefix up to that block. Blocks whose reference count drops to 0 go
to the tail of a free queue but keep their hash: a later request with the same prefix takes them back
(a prefix-cache hit) until they are evicted, oldest first, to make room for new blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockPool", "block_hashes"]


def block_hashes(
    token_ids: Sequence[int], block_size: int, start: int = 0, parent: int | None = None
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` from block index ``start`` on.

    ``parent`` is the hash of block ``start - 1`` (``None`` for the first block). Python hashes tuples of
    ints the same way in every process, so the hashes are deterministic.
    """
    out: list[int] = []
    h = parent
    for b in range(start, len(token_ids) // block_size):
        h = hash((h, tuple(token_ids[b * block_size : (b + 1) * block_size])))
        out.append(h)
    return out


class BlockPool:
    """Fixed pool of KV blocks: allocate, share cached blocks, release, evict least recently freed."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash → block id

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (free ones, cached ones with no user included)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use by some request (vLLM's ``kv_cache_usage_perc``: 1 means full)."""
        return 1.0 - len(self._free) / self.num_blocks

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest run of ``hashes`` (from the first) that the cache holds."""
        if not self.enable_caching:
            return []
        hits: list[int] = []
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` (cache hits) sit in the free queue and would leave it when taken."""
        return sum(1 for b in blocks if self._ref[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks (a prefix-cache hit)."""
        for b in blocks:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh blocks (evicting cached ones, oldest first), or ``None`` when too few are free."""
        if n > len(self._free):
            return None
        out: list[int] = []
        for _ in range(n):
            b, _unused = self._free.popitem(last=False)
            h = self._hash[b]
            if h is not None:
                if self._cached.get(h) == b:
                    del self._cached[h]
                self._hash[b] = None
            self._ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block; unused ones join the free queue, last block first.

        Freeing in reverse order puts a request's tail blocks ahead of its head blocks in the eviction
        order, so a shared prefix outlives the unique suffixes built on it (vLLM does the same).
        """
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
            elif self._ref[b] < 0:
                raise RuntimeError(f"KV block {b} released more often than taken")

    def cache(self, block: int, block_hash: int) -> None:
        """Record that ``block`` now holds the full block named ``block_hash``."""
        if not self.enable_caching or self._hash[block] is not None:
            return
        self._hash[block] = block_hash
        self._cached.setdefault(block_hash, block)

    def reset_cache(self) -> None:
        """Forget every cached hash (blocks in use stay allocated)."""
        self._cached.clear()
        self._hash = [None] * self.num_blocks
