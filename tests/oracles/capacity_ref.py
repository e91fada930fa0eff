"""Slow, obviously correct capacity-curve simulations: the ground truth the fast code is tested against.

Each function simulates one cache of one capacity request by request, exactly as the semantics in
`docs/capacity.md` read, with no cleverness: an `OrderedDict` LRU (vLLM eviction order, docs/engines.md)
and a brute-force Belady (1966) optimal cache with bypass that scans the future for every decision. They are
quadratic-ish and meant only for small traces in tests.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from prefixscan.encode.hashing import hit_tokens


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
    used: this is vLLM's reverse-order free queue (docs/engines.md, 'The block pool').
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
    """(hit tokens, hit blocks) of the optimal cache with bypass holding at most `capacity_blocks` blocks.

    The definition of docs/capacity.md, literally. For each request in order: the hit is its run of
    leading cached blocks; then its blocks are offered in order and a cached one is skipped. With a full
    cache the victim is the cached block, not listed by this request, that is next listed latest (by
    request, then by position in that request); it is evicted only if that request is strictly later
    than the offered block's next one. Otherwise the block is refused and so are the request's remaining
    blocks, which is why an admitted block's predecessor in the request is always cached. Blocks never
    listed again tie at "never"; which of those goes changes no later hit.
    """
    reqs = _requests(offsets, hashes)
    n_req = len(reqs)

    def next_use(b: int, now: int) -> tuple[int, int]:
        for r in range(now + 1, n_req):
            if b in reqs[r]:
                return r, reqs[r].index(b)
        return n_req, 0

    cache: set[int] = set()
    tok = 0
    blk = 0
    for i, blocks in enumerate(reqs):
        k = _leading_present(blocks, cache)
        tok += hit_tokens(k, int(prompt_tokens[i]), block_size, rule)
        blk += k
        for b in blocks:
            if b in cache:
                continue
            if len(cache) >= capacity_blocks:
                others = [c for c in cache if c not in blocks]
                if not others:
                    break
                victim = max(others, key=lambda c: next_use(c, i))
                if next_use(victim, i)[0] <= next_use(b, i)[0]:
                    break
                cache.remove(victim)
            cache.add(b)
    return tok, blk
