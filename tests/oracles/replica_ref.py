"""Brute-force replica cache for the property tests: vLLM's block pool as `pool_ref.ReferencePool`.

Linear-scan matching (no prefix-closure assumption), physical blocks with identities, dicts and an
ordered dict as the free queue. `kvcache.KVState` must agree with it on every hit length, eviction and
resident set; this class only adapts the pool to the simulator's calls (a request id per admission).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from tests.oracles.pool_ref import ReferencePool


class ReferenceReplica:
    """One replica: a pool of `capacity` blocks (block 0 is the null block)."""

    def __init__(self, capacity: int) -> None:
        self.pool = ReferencePool(max(capacity, 1))

    @property
    def cached(self) -> set[Hashable]:
        return set(self.pool.copies)

    @property
    def evicted(self) -> list[Hashable]:
        return self.pool.evicted

    def available(self) -> int:
        return len(self.pool.free)

    def match(self, blocks: Sequence[int]) -> int:
        return len(self.pool.lookup(list(blocks), len(blocks)))

    def admit(self, rid: Hashable, blocks: Sequence[int], max_hit: int, total: int) -> int:
        """Returns hit blocks, or -1 (and changes nothing) when memory is short."""
        return self.pool.start(rid, list(blocks), total, max_hit)

    def release(self, rid: Hashable) -> None:
        self.pool.finish(rid)

    def release_gen(self, rid: Hashable, gen: Sequence[int]) -> int:
        """Give the blocks generated tokens filled their hashes, then release; returns how many ids
        became cached."""
        before = set(self.pool.copies)
        self.pool.extend(rid, list(gen))
        stored = len(set(self.pool.copies) - before)
        self.pool.finish(rid)
        return stored

    def clear_free(self) -> int:
        before = set(self.pool.copies)
        self.pool.clear_free()
        return len(before - set(self.pool.copies))
