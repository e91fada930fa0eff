"""Slow, obviously correct capacity-curve simulations: the ground truth the fast code is tested against.

Each function simulates one cache of one capacity request by request, exactly as the semantics in
`docs/capacity.md` read, with no cleverness: an `OrderedDict` LRU (vLLM eviction order, REFERENCE.md 1)
and a brute-force Belady (1966) optimal cache that scans the future for every eviction. They are
quadratic-ish and meant only for small traces in tests.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from prefixscan.hashing import hit_tokens


def _requests(offsets: np.ndarray, hashes: np.ndarray) -> list[list[int]]:
    """Split the CSR block arrays into one Python list of hashes per request."""
    return [[int(h) for h in hashes[offsets[i] : offsets[i + 1]]] for i in range(len(offsets) - 1)]


def _leading_present(blocks: list[int], cache: dict[int, object] | set[int]) -> int:
    """Number of leading blocks found in `cache`; the match stops at the first miss, as in vLLM."""
    k = 0
    for b in blocks:
        if b not in cache:
            break
        k += 1
    return k


def lru_hit_tokens_ref(offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray,
                       block_size: int, rule: str, capacity_blocks: int) -> tuple[int, int]:
    """(hit tokens, hit blocks) of one LRU cache holding at most `capacity_blocks` blocks.

    After a request, its blocks are touched tail first and head last, so the head is the most recently
    used: this is vLLM's reverse-order free queue (REFERENCE.md 1).
    """
    cache: OrderedDict[int, None] = OrderedDict()
    tok = 0
    blk = 0
    for i, blocks in enumerate(_requests(offsets, hashes)):
        k = _leading_present(blocks, cache)
        tok += hit_tokens(k, int(prompt_tokens[i]), block_size, rule)
        blk += k
        for b in reversed(blocks):
            if b in cache:
                cache.move_to_end(b)
            else:
                cache[b] = None
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return tok, blk


def ideal_hit_tokens_ref(offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray,
                         block_size: int, rule: str) -> int:
    """Hit tokens of an infinite cache: every block ever seen stays cached."""
    seen: set[int] = set()
    tok = 0
    for i, blocks in enumerate(_requests(offsets, hashes)):
        tok += hit_tokens(_leading_present(blocks, seen), int(prompt_tokens[i]), block_size, rule)
        seen.update(blocks)
    return tok


def opt_hit_tokens_ref(offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray,
                       block_size: int, rule: str, capacity_blocks: int) -> tuple[int, int]:
    """(hit tokens, hit blocks) of Belady's farthest-next-use cache holding at most `capacity_blocks`.

    Rules (the same as the fast code, see docs/capacity.md):
    - a request's blocks are all inserted after its lookup; if it has more blocks than the capacity, only
      its first `capacity_blocks` (head) blocks are kept, since only a prefix can ever hit;
    - to make room, evict the cached block whose next request is farthest in the future (never used
      again = infinitely far); ties go to the block that sat deeper in the request that last touched it,
      so the cache stays prefix-closed. The current request's cached blocks have next use "now" and are
      therefore the last candidates.
    """
    reqs = _requests(offsets, hashes)
    n_req = len(reqs)
    members = [set(blocks) for blocks in reqs]

    def next_use(b: int, start: int) -> int:
        for r in range(start, n_req):
            if b in members[r]:
                return r
        return n_req  # never again

    depth: dict[int, int] = {}  # cached block -> its position in the request that last touched it
    tok = 0
    blk = 0
    for i, blocks in enumerate(reqs):
        k = _leading_present(blocks, depth)
        tok += hit_tokens(k, int(prompt_tokens[i]), block_size, rule)
        blk += k
        keep = blocks[:capacity_blocks]
        new = [b for b in keep if b not in depth]
        while depth and len(depth) + len(new) > capacity_blocks:
            victim = max(depth, key=lambda b: (next_use(b, i), depth[b]))
            del depth[victim]
        for j, b in enumerate(keep):
            depth[b] = j
    return tok, blk
