"""Brute-force replica cache: the vLLM rules written as plainly as possible, for property tests.

Linear-scan matching (no prefix-closure assumption), a Python list as the free queue, dicts for ref
counts. `kvcache.KVState` must agree with it on every hit length, eviction and resident set.
"""

from __future__ import annotations

from collections.abc import Sequence


class ReferenceReplica:
    """One replica: `capacity` block slots, LRU free queue, lazy eviction, reverse-order release."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.cached: set[int] = set()
        self.ref: dict[int, int] = {}
        self.free_queue: list[int] = []  # index 0 is evicted first
        self.anonymous = 0  # reserved decode blocks
        self.evicted: list[int] = []

    def used(self) -> int:
        return len(self.cached) + self.anonymous

    def match(self, blocks: Sequence[int]) -> int:
        k = 0
        while k < len(blocks) and blocks[k] in self.cached:
            k += 1
        return k

    def admit(self, blocks: Sequence[int], extra: int) -> int:
        """Returns matched blocks, or -1 (and changes nothing) when memory is short."""
        k = self.match(blocks)
        hit_in_queue = sum(1 for b in blocks[:k] if self.ref.get(b, 0) == 0)
        free_slots = self.capacity - self.used() + len(self.free_queue) - hit_in_queue
        if len(blocks) - k + extra > free_slots:
            return -1
        for b in blocks[:k]:
            if self.ref.get(b, 0) == 0:
                self.free_queue.remove(b)
            self.ref[b] = self.ref.get(b, 0) + 1
        for b in list(blocks[k:]) + [None] * extra:
            if self.used() >= self.capacity:
                victim = self.free_queue.pop(0)
                self.cached.discard(victim)
                del self.ref[victim]
                self.evicted.append(victim)
            if b is None:
                self.anonymous += 1
            else:
                self.cached.add(b)
                self.ref[b] = 1
        return k

    def release(self, blocks: Sequence[int], extra: int) -> None:
        for b in reversed(list(blocks)):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free_queue.append(b)
        self.anonymous -= extra

    def release_gen(self, blocks: Sequence[int], gen: Sequence[int], extra: int) -> int:
        """Cache generated blocks in reserved decode slots, then release; returns how many were new."""
        stored = 0
        for b in reversed(list(gen)[:extra]):
            if b not in self.cached:
                self.cached.add(b)
                self.ref[b] = 0
                self.free_queue.append(b)
                self.anonymous -= 1
                stored += 1
            elif self.ref[b] == 0:
                self.free_queue.remove(b)
                self.free_queue.append(b)
        self.release(blocks, extra - stored)
        return stored

    def clear_free(self) -> int:
        n = len(self.free_queue)
        for b in self.free_queue:
            self.cached.discard(b)
            del self.ref[b]
        self.free_queue = []
        return n
