"""What a router knows about each replica's cache: exact, delayed events, or its own decisions + TTL.

- exact: the engine's KV events with no delay (Dynamo / llm-d precise mode): the router sees the real
  resident set.
- delayed: the same events delivered `delay` seconds late (BlockStored / BlockRemoved /
  AllBlocksCleared, docs/engines.md, 'What the engine reports'), so the view is the cache as it was `delay` seconds ago.
- approximate: no events; the router assumes a replica holds every block it routed there in the last
  `ttl` seconds (Dynamo `--no-kv-events`, TTL 120 s; llm-d's approximate scorer with an LRU cap; the
  SGLang router's tree pruned to `max_blocks` every `sweep_s`). Restarts are invisible to it.
Every view stays prefix-closed (events arrive in order; a routed request refreshes its whole chain), so
all three match by binary search.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from prefixscan.sim.kvcache import KVState, match_all


class ExactView:
    """The engine's own resident set."""

    name = "exact"

    def __init__(self, kv: KVState) -> None:
        self.kv = kv

    def match(self, blocks: np.ndarray, now: float, out: np.ndarray) -> np.ndarray:
        match_all(self.kv.res, blocks, out)
        return out

    def advance(self, now: float) -> None:
        """Nothing to deliver: the view is always current."""

    def on_store(self, r: int, ids: np.ndarray, now: float) -> None:
        """An engine event (block ids stored, evicted, cleared) or a routing decision: an exact view reads the
        engine state directly, so none of them teaches it anything."""

    on_evict = on_clear = on_route = on_store


class DelayedView(ExactView):
    """A copy of the resident set fed by engine events after a fixed delay."""

    name = "delayed"

    def __init__(self, kv: KVState, delay_s: float) -> None:
        super().__init__(kv)
        self.delay = delay_s
        self.res = np.zeros_like(kv.res)
        self.pending: deque[tuple[float, int, int, np.ndarray]] = deque()

    def match(self, blocks: np.ndarray, now: float, out: np.ndarray) -> np.ndarray:
        self.advance(now)
        match_all(self.res, blocks, out)
        return out

    def advance(self, now: float) -> None:
        q = self.pending
        while q and q[0][0] <= now:
            _, r, value, ids = q.popleft()
            self.res[r, ids] = value

    def on_store(self, r: int, blocks: np.ndarray, now: float) -> None:
        if len(blocks):
            self.pending.append((now + self.delay, r, 1, blocks.copy()))

    def on_evict(self, r: int, ids: np.ndarray, now: float) -> None:
        if len(ids):
            self.pending.append((now + self.delay, r, 0, ids.copy()))

    on_clear = on_evict


class ApproxView(ExactView):
    """Blocks the router itself sent to each replica, forgotten after `ttl_s` or pruned LRU-first.

    Each routing decision is kept as a record (time, blocks); a block's entry holds the time of its
    latest record. Expiring the oldest record drops exactly the blocks no later record refreshed, so the
    live count is exact and pruning costs O(blocks routed), never a scan of the block space. Record
    times are made strictly increasing per replica, which keeps the view prefix-closed.
    """

    name = "approximate"

    def __init__(self, kv: KVState, ttl_s: float, max_blocks: int | None = None, sweep_s: float | None = None) -> None:
        super().__init__(kv)
        self.ttl = ttl_s
        self.max_blocks = max_blocks
        self.sweep_s = sweep_s
        n = kv.res.shape[0]
        self.last = np.full(kv.res.shape, -np.inf, dtype=np.float64)
        self.count = [0] * n
        self.records: list[deque[tuple[float, float, np.ndarray]]] = [deque() for _ in range(n)]
        self.prev_t = [-np.inf] * n
        self.next_sweep = sweep_s if sweep_s else np.inf

    def match(self, blocks: np.ndarray, now: float, out: np.ndarray) -> np.ndarray:
        self.advance(now)
        match_all(self.last, blocks, out, now - self.ttl)
        return out

    def _expire_oldest(self, r: int) -> None:
        _, t, blocks = self.records[r].popleft()
        row = self.last[r]
        mine = blocks[row[blocks] == t]
        row[mine] = -np.inf
        self.count[r] -= len(mine)

    def advance(self, now: float) -> None:
        if self.ttl != np.inf:
            limit = now - self.ttl
            for r, q in enumerate(self.records):
                while q and q[0][0] <= limit:  # by the true routing time
                    self._expire_oldest(r)
        if self.sweep_s is not None and now >= self.next_sweep:
            while self.next_sweep <= now:
                self.next_sweep += self.sweep_s
            for r in range(len(self.records)):
                self._prune(r)

    def _prune(self, r: int) -> None:
        if self.max_blocks is None:
            return
        while self.count[r] > self.max_blocks and self.records[r]:
            self._expire_oldest(r)

    def on_route(self, r: int, blocks: np.ndarray, now: float) -> None:
        t = now if now > self.prev_t[r] else float(np.nextafter(self.prev_t[r], np.inf))
        self.prev_t[r] = t
        row = self.last[r]
        self.count[r] += int(np.count_nonzero(row[blocks] == -np.inf))
        row[blocks] = t
        self.records[r].append((now, t, blocks))
        if self.sweep_s is None:
            self._prune(r)  # continuous LRU cap (llm-d); SGLang prunes only at its sweeps

    def size(self, r: int) -> int:
        return self.count[r]


def make_view(kind: str, kv: KVState, delay_s: float = 0.0, ttl_s: float = 120.0, max_blocks: int | None = None,
              sweep_s: float | None = None) -> ExactView:
    """Build the view a policy asked for."""
    kind = view_kind(kind, delay_s)
    if kind == "exact":
        return ExactView(kv)
    if kind == "delayed":
        return DelayedView(kv, delay_s)
    return ApproxView(kv, ttl_s, max_blocks, sweep_s)


def view_kind(kind: str, delay_s: float) -> str:
    """The view a knowledge mode amounts to ("delayed" by 0 s is "exact"), for both engines."""
    if kind not in ("exact", "delayed", "approximate"):
        raise ValueError(f"unknown knowledge mode {kind!r}")
    return "exact" if kind == "delayed" and delay_s == 0 else kind
