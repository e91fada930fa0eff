"""The slow, obviously correct model of `sim.tiers.LRUTier`: a list of (last use, id) scanned in full."""

from __future__ import annotations


class ReferenceLRU:
    """The same tier as a list of (last use, id) scanned in full: slow, plainly right."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.items: list[list[int]] = []  # [last_use, id]
        self.clock = 0
        self.evictions = 0

    def __contains__(self, b: int) -> bool:
        return any(it[1] == b for it in self.items)

    def __len__(self) -> int:
        return len(self.items)

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def touch(self, ids: list[int]) -> None:
        for b in reversed(ids):
            for it in self.items:
                if it[1] == b:
                    it[0] = self._tick()

    def put(self, ids: list[int]) -> None:
        if self.capacity == 0:
            return
        for b in reversed(ids):
            hit = [it for it in self.items if it[1] == b]
            if hit:
                hit[0][0] = self._tick()
                continue
            self.items.append([self._tick(), b])
            if self.capacity is not None and len(self.items) > self.capacity:
                self.items.remove(min(self.items))
                self.evictions += 1

    def clear(self) -> None:
        self.items.clear()
