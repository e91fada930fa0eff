"""The keyed LRU stack over listed blocks, one pass for every capacity (Mattson et al., 1970), with its
block histogram: the compiled kernel the product once ran for the capacity curve, superseded by
`reuse.pool_fast.lru_pool_curves` (the same keyed curve and the pool's, in one pass). Kept for the tests as
a second, independently written LRU curve to compare against (`lru_curves(prep)[0]` equals
`lru_pool_curves(...)[0]`) and against the brute-force `capacity_ref`."""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixscan.reuse.capacity.lru import Prepared, prepare
from prefixscan.reuse.pool_fast import _renumber, lru_tree_slots


@njit(cache=True, nogil=True)
def _lru_chunk(offsets, ids, weights, tree, last, tok_hist, blk_hist, st):  # pragma: no cover - compiled
    """Add one run of requests to the histograms over prefix-max stack distance of (hit tokens, hit blocks);
    resumable: st = [marked, clock] and the arrays carry the state to the next run. An empty blk_hist
    skips the block histogram.

    Times 1..len(tree)-1 are virtual access times; within a request the tail gets the earliest time and
    the head the latest (vLLM frees blocks in reverse order). The Fenwick tree marks each block's latest
    time, so the number of distinct blocks used more recently than block b is marked - prefix(last[b]).
    When the clock reaches the end of the tree the marks are renumbered (`_renumber`): the tree needs
    more slots than blocks seen, not one per access.
    """
    n_req = len(offsets) - 1
    size = len(tree) - 1
    marked = st[0]
    clock = st[1]
    blocks = len(blk_hist) > 0
    for r in range(n_req):
        a = offsets[r]
        b = offsets[r + 1]
        dmax = 0
        for p in range(a, b):  # distances before this request's own accesses are applied
            t = last[ids[p]]
            if t == 0:
                break  # a new block: this and every later block of the request miss at every capacity
            s = 0
            i = t
            while i > 0:
                s += tree[i]
                i -= i & -i
            d = marked - s
            if d > dmax:
                dmax = d
            tok_hist[dmax] += weights[p]
            if blocks:
                blk_hist[dmax] += 1
        for p in range(b - 1, a - 1, -1):  # tail first, so the head ends up most recent
            if clock == size:
                clock = _renumber(tree, last)
            clock += 1
            blk = ids[p]
            t = last[blk]
            if t == 0:
                marked += 1
            else:
                i = t
                while i <= size:
                    tree[i] -= 1
                    i += i & -i
            i = clock
            while i <= size:
                tree[i] += 1
                i += i & -i
            last[blk] = clock
    st[0] = marked
    st[1] = clock


def lru_curves(prep: Prepared) -> tuple[np.ndarray, np.ndarray]:
    """(hit tokens, hit blocks) for every capacity c = 0 .. n_distinct blocks, as cumulative arrays.

    A block hits at capacity c iff the largest stack distance among it and the blocks before it in its
    request is < c, so hits(c) is the cumulative sum of the distance histogram below c. Capacities
    beyond n_distinct hold everything: use the last element.
    """
    n = prep.n_distinct
    tree = np.zeros(min(lru_tree_slots(n), len(prep.ids)) + 1, np.int32)  # no renumbering if it holds them all
    last = np.zeros(n, np.int32)  # 0 = never seen
    tok_hist = np.zeros(n + 1, np.int64)
    blk_hist = np.zeros(n + 1, np.int64)
    _lru_chunk(prep.offsets, prep.ids, prep.weights, tree, last, tok_hist, blk_hist, np.zeros(2, np.int64))
    zero = np.zeros(1, np.int64)
    tok = np.concatenate([zero, np.cumsum(tok_hist[: prep.n_distinct])])
    blk = np.concatenate([zero, np.cumsum(blk_hist[: prep.n_distinct])])
    return tok, blk


def lru_hit_tokens_all_capacities(offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray,
                                  block_size: int, rule: str) -> np.ndarray:
    """Hit tokens of one LRU cache for every capacity in blocks: element c is the hit at c blocks.

    Length n_distinct + 1; the last element is the infinite-cache (ideal) hit. Ask any capacity with
    `curve[min(c, len(curve) - 1)]`.
    """
    return lru_curves(prepare(offsets, hashes, prompt_tokens, block_size, rule))[0]
