"""vLLM's block pool written as plainly as possible: the ground truth for bounded-cache hits.

This is a model of `vllm/v1/core/block_pool.py` and the full-attention path of `kv_cache_manager.py`
(vLLM 0.32.0), with physical blocks that have identities, as the engine has them:

- the pool has `num_blocks` physical blocks; block 0 is the reserved null block, so at most
  `num_blocks - 1` ever hold data;
- the free queue holds every block not used by a running request, in eviction order; at start it is
  blocks 1..N-1 in id order (never-used blocks go first);
- a lookup walks the request's full-block hashes from the start and stops at the first miss, and at
  `floor((n-1)/B)` blocks (the last prompt token is always recomputed); a hit on a hash with several
  copies uses the copy cached first;
- admission: the hit blocks are touched (pinned, taken out of the free queue), then the rest of the
  request's blocks (including a partial last block) are taken from the head of the free queue; a taken
  block that holds a hash loses it (lazy eviction). Then every new *full* block gets its hash, even when
  that hash is already cached in another block: after a capped full hit the recomputed last block is a
  second copy (vLLM does not de-duplicate);
- a request that does not fit (new blocks + hit blocks now in the free queue > free queue) waits;
- on finish its blocks are freed in reverse order: the ones no longer used that hold a hash go to the
  tail of the free queue, so a request's tail is evicted before its head; the ones that hold no hash (a
  partial last block, unused decode blocks) go to its *front* and are reused first (vLLM 0.32
  `BlockPool.free_blocks`: "LIFO reuse of non-cached blocks"), so they hold space only while the
  request runs;
- generated tokens get a hash once they fill a block (`cache_generated`), like prompt blocks.

`pool_hits_ref` runs requests one at a time (each prefill finishes before the next arrives), which is
what the capacity curve models; `ReferencePool` also runs concurrent requests for the simulator's
reference. Everything is dicts and lists; it is slow and meant for tests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Running:
    """One request's block table while it runs."""

    blocks: list[int]  # physical block ids, in token order
    keys: list[Hashable]  # hashes of its full blocks (a prefix of `blocks` may be hashed)
    hit: int  # blocks that were cache hits
    cached: int = 0  # leading blocks of `blocks` that hold a hash


@dataclass
class ReferencePool:
    """vLLM's BlockPool + KV cache manager for one replica, physical block by physical block."""

    num_blocks: int
    free: OrderedDict[int, None] = field(init=False)  # the free queue: first = evicted first
    key_of: dict[int, Hashable] = field(init=False)  # physical block -> its hash (cached blocks only)
    copies: dict[Hashable, list[int]] = field(init=False)  # hash -> its blocks, first cached first
    ref: dict[int, int] = field(init=False)  # physical block -> running requests using it
    running: dict[Hashable, _Running] = field(init=False)
    evicted: list[Hashable] = field(init=False)  # hashes whose last copy was evicted, in order
    duplicates: int = field(init=False, default=0)  # full blocks cached while their hash already was

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"a pool needs at least 1 block (the null block), got {self.num_blocks}")
        self.free = OrderedDict((b, None) for b in range(1, self.num_blocks))  # block 0 is the null block
        self.key_of, self.copies, self.ref, self.running, self.evicted = {}, {}, {}, {}, []

    def cached(self, key: Hashable) -> bool:
        return key in self.copies

    def lookup(self, keys: Sequence[Hashable], max_blocks: int) -> list[int]:
        """The first copy of each leading cached hash, at most `max_blocks` of them."""
        out = []
        for key in keys[:max(max_blocks, 0)]:
            if key not in self.copies:
                break
            out.append(self.copies[key][0])
        return out

    def start(self, rid: Hashable, keys: Sequence[Hashable], total_blocks: int, max_hit_blocks: int) -> int:
        """Admit request `rid` with full-block hashes `keys` needing `total_blocks` blocks in all (full,
        partial and reserved ones); returns its hit blocks, or -1 (nothing changes) if it does not fit."""
        hits = self.lookup(keys, max_hit_blocks)
        new = max(total_blocks, len(keys)) - len(hits)
        if new + sum(1 for b in hits if self.ref.get(b, 0) == 0) > len(self.free):
            return -1
        for b in hits:  # touch
            if self.ref.get(b, 0) == 0:
                del self.free[b]
            self.ref[b] = self.ref.get(b, 0) + 1
        blocks = list(hits)
        for _ in range(new):
            b, _ = self.free.popitem(last=False)
            self._drop_hash(b)
            self.ref[b] = 1
            blocks.append(b)
        req = _Running(blocks, list(keys), len(hits), len(hits))
        self.running[rid] = req
        self._cache_upto(req, len(keys))
        return len(hits)

    def extend(self, rid: Hashable, keys: Sequence[Hashable]) -> None:
        """The request's tokens now fill more blocks (generated tokens): give them their hashes."""
        req = self.running[rid]
        req.keys.extend(keys)
        self._cache_upto(req, min(len(req.keys), len(req.blocks)))

    def decode(self, rid: Hashable, keys: Sequence[Hashable], tokens_before: int, tokens_after: int,
               block_size: int) -> bool:
        """The request computes tokens tokens_before..tokens_after-1 one decode step at a time: a token
        that starts a block past the table takes a new block from the free queue, and a block it fills
        gets its hash from `keys` (the request's full-block hashes, prompt and generated). Returns False
        (and stops) if a new block is needed and the free queue is empty."""
        req = self.running[rid]
        req.keys = list(keys)
        for t in range(tokens_before, tokens_after):
            if t // block_size >= len(req.blocks):
                if not self.free:
                    return False
                b, _ = self.free.popitem(last=False)
                self._drop_hash(b)
                self.ref[b] = 1
                req.blocks.append(b)
            if (t + 1) % block_size == 0:
                self._cache_upto(req, min((t + 1) // block_size, len(req.keys)))
        return True

    def finish(self, rid: Hashable) -> None:
        """Free the request's blocks in reverse order: the ones no longer used that hold a hash go to the
        tail of the free queue (tail first, so the request's head is the most recent), the ones without
        a hash to its front, in that order (they are reused first and nothing is evicted for them)."""
        req = self.running.pop(rid)
        front, tail = [], []
        for b in reversed(req.blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                del self.ref[b]
                (tail if b in self.key_of else front).append(b)
        for b in reversed(front):
            self.free[b] = None
            self.free.move_to_end(b, last=False)
        for b in tail:
            self.free[b] = None

    def clear_free(self) -> int:
        """Drop the hash of every block in the free queue (a restart); returns how many held one."""
        n = 0
        for b in list(self.free):
            if b in self.key_of:
                self._drop_hash(b, evicted=False)
                n += 1
        return n

    def _cache_upto(self, req: _Running, n_full: int) -> None:
        for j in range(req.cached, n_full):
            b, key = req.blocks[j], req.keys[j]
            if key in self.copies:
                self.duplicates += 1
            self.copies.setdefault(key, []).append(b)
            self.key_of[b] = key
        req.cached = max(req.cached, n_full)

    def _drop_hash(self, b: int, evicted: bool = True) -> None:
        """Block b loses its hash (it is reused, or the cache is cleared)."""
        key = self.key_of.pop(b, None)
        if key is None:
            return
        self.copies[key].remove(b)
        if not self.copies[key]:
            del self.copies[key]
            if evicted:
                self.evicted.append(key)


def request_shape(n_listed: int, prompt_tokens: int, block_size: int, rule: str) -> tuple[int, int]:
    """(blocks a prefill of the request occupies, most blocks its hit may cover).

    Occupied: its listing, or ceil(n/B) blocks if more (the blocks past the listing hold no hash).
    "vllm": the listed blocks are the full ones, so a partial last block (n not a multiple of B) is one
    more; the hit is capped at floor((n-1)/B). "trace": a hashed trace lists its partial last block
    itself, and every listed block within the prompt's ceil(n/B) blocks may hit (the trace's own
    accounting; the cap only matters for records whose length disagrees with their listing).
    """
    from prefixscan.encode.hashing import hit_cap_tokens, is_trace_rule  # the rule's one home, not a second copy

    n = max(prompt_tokens, 0)
    total = max(n_listed, -(-n // block_size))
    return total, min(n_listed, -(-hit_cap_tokens(n, block_size, is_trace_rule(rule)) // block_size))


def pool_hits_ref(offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray, block_size: int,
                  num_blocks: int, rule: str = "vllm") -> np.ndarray:
    """Cached tokens per request with vLLM's block pool of `num_blocks` blocks, requests one at a time.

    A request needing more blocks than the pool holds (vLLM refuses to start such an engine) gets its
    hit as usual and then leaves the pool holding only its first `num_blocks - 1` full blocks, head most
    recent: what the pool would hold had it been just big enough for the request and then shrunk from
    the head of the free queue.
    """
    from prefixscan.encode.hashing import hit_tokens

    pool = ReferencePool(max(num_blocks, 1))
    out = np.zeros(len(offsets) - 1, np.int64)
    for i in range(len(offsets) - 1):
        keys = [int(h) for h in hashes[offsets[i]:offsets[i + 1]]]
        n = int(prompt_tokens[i])
        total, cap = request_shape(len(keys), n, block_size, rule)
        k = len(pool.lookup(keys, cap))
        out[i] = hit_tokens(k, n, block_size, rule)
        if total > pool.num_blocks - 1:
            dups = pool.duplicates
            pool = ReferencePool(pool.num_blocks)
            pool.duplicates = dups
            keys, total, cap = keys[: pool.num_blocks - 1], pool.num_blocks - 1, 0
        if pool.start(i, keys, total, cap) != (k if cap else 0):
            raise AssertionError("lookup and admission disagree")
        pool.finish(i)
    return out
