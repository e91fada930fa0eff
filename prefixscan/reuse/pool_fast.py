"""vLLM's block pool at every size at once, from the one-pass LRU stack distances, where that is exact.

`pool.py` runs the pool once per size. Most sizes need none of it: while no request is oversized, no
block is cached twice (a duplicate copy) and no empty slot is left over from an earlier request, the pool
of N blocks holds, before request r, exactly the N - 1 - u most recently used distinct blocks, where u is
the number of unlisted blocks request r - 1 occupied (a partial last block without an id goes to the front
of the free queue and is the first slot reused). The free queue's order is the keyed LRU stack's order
(a request's blocks released tail first, so its head is most recent). So a block
hits at size N iff the largest stack distance d among it and the blocks before it, plus u, is < N - 1,
and one histogram over d + u gives the hit of every such size.

The kernel also bounds where that holds. Sizes from `lo` to `hi` (`FastPool`) are exact:
- lo = the most blocks a request occupies + 1 (smaller pools clear themselves for an oversized request);
- hi - 1 = the least d + u over the references that could make a duplicate or leave an empty slot behind:
  a block seen before but beyond the request's hit cap or after a block that misses (a second copy at any
  size where it is cached), and the block whose hit would leave fewer new slots than the previous
  request's empties; a block listed twice in one request makes hi = 0 (nothing is fast).
Other sizes are simulated (`pool.pool_curve`). `tests/test_pool_fast.py` checks the two agree, value for
value, on random traces built to hit every one of those cases.

The Fenwick tree over virtual access times is shared with `capacity.stream` (and the tests'
`tests/oracles/lru_stack.py`): renumbering the marks when the clock reaches the end lets a tree of
O(distinct) slots serve any number of accesses (`_renumber`, `lru_tree_slots`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from prefixscan.reuse.hitrule import cap_blocks_array

# st of the kernel: [marked, clock, u of the previous request, least risky d + u]
MARKED, CLOCK, U_PREV, RISK = range(4)
NO_RISK = np.iinfo(np.int64).max


@njit(cache=True, nogil=True)
def _renumber(tree, last):  # pragma: no cover - compiled
    """Renumber the marked times to 1..marked, keeping their order, and rebuild the tree over them.

    Distances only count marks, so an order-preserving renumbering changes none of them; it is what lets
    a tree of O(distinct) slots serve an unbounded number of accesses. In place, O(len(tree) + len(last)).
    """
    n = len(tree) - 1
    for i in range(n, 0, -1):  # Fenwick -> plain 0/1 marks (the O(n) build, undone in reverse)
        j = i + (i & -i)
        if j <= n:
            tree[j] -= tree[i]
    s = 0
    for i in range(1, n + 1):  # marks -> their rank
        s += tree[i]
        tree[i] = s
    for b in range(len(last)):
        if last[b] > 0:
            last[b] = tree[last[b]]
    _fenwick_ones(tree, s)
    return s


@njit(cache=True, nogil=True)
def _fenwick_ones(tree, m):  # pragma: no cover - compiled
    """The Fenwick tree of marks at times 1..m: slot i counts the marks in (i - lowbit(i), i]."""
    tree[0] = 0
    for i in range(1, len(tree)):
        tree[i] = max(0, min(i, m) - (i - (i & -i)))


def lru_tree_slots(n_distinct: int, floor: int = 1 << 16) -> int:
    """Slots of the LRU Fenwick tree: twice the distinct blocks, so a renumbering frees at least half of
    it (amortised O(1) per access), within int32 times."""
    return min(max(2 * n_distinct, floor), (1 << 31) - 2)


def request_shape(offsets: np.ndarray, prompts: np.ndarray, block_size: int,
                  rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Per request, as `pool._pool_chunk` sees it: (hit cap in blocks, unlisted blocks occupied), int64."""
    nb = np.diff(np.asarray(offsets, dtype=np.int64))
    n = np.asarray(prompts, dtype=np.int64)
    cap = np.minimum(nb, cap_blocks_array(n, block_size, rule))
    total = np.where(n > 0, np.maximum(nb, -(-n // block_size)), nb)
    return cap.astype(np.int64), (total - nb).astype(np.int64)


def new_st() -> np.ndarray:
    st = np.zeros(4, np.int64)
    st[RISK] = NO_RISK
    return st


@njit(cache=True, nogil=True)
def _distance(tree, marked, t):  # pragma: no cover - compiled
    s = 0
    i = t
    while i > 0:
        s += tree[i]
        i -= i & -i
    return marked - s


@njit(cache=True, nogil=True)
def _request_distances(offsets, ids, weights, cap, unl, tree, last, tok_hist, pool_hist, st, r):  # pragma: no cover
    """Histogram one request's blocks (before its accesses) and lower the risk bound."""
    a = offsets[r]
    b = offsets[r + 1]
    marked = st[MARKED]
    u = st[U_PREV]
    risk = st[RISK]
    dmax = 0
    missed = False  # a block that is new at every size was met
    for p in range(a, b):
        t = last[ids[p]]
        if t == 0:
            missed = True
            continue
        d = _distance(tree, marked, t)
        if missed or d < dmax or p - a >= cap[r]:
            risk = min(risk, d + u)  # cached here while a block before it misses, or beyond the cap
        if missed:
            continue
        if d > dmax:
            dmax = d
        tok_hist[dmax] += weights[p]
        pool_hist[dmax + u] += weights[p]
    # Fewer new slots than the previous request's empties leaves one behind: when its block j = nb - delta hits.
    delta = u - unl[r]
    j = (b - a) - delta
    if delta > 0:
        if j < 0:
            risk = -1
        elif j < cap[r]:
            d = 0
            for p in range(a, a + j + 1):  # the prefix max up to j (a block never seen: never a hit)
                d = max(d, _distance(tree, marked, last[ids[p]]) if last[ids[p]] > 0 else NO_RISK)
            if d < NO_RISK:
                risk = min(risk, d + u)
    st[RISK] = risk
    st[U_PREV] = unl[r]


@njit(cache=True, nogil=True)
def _lru_pool_chunk(offsets, ids, weights, cap, unl, tree, last, tok_hist, pool_hist, st):  # pragma: no cover
    """The keyed LRU histogram (tok_hist, over prefix-max distance) and the pool's
    (pool_hist, over that plus the previous request's unlisted blocks), with the risk bound, one run of
    requests; resumable through the arrays and st (`new_st`)."""
    size = len(tree) - 1
    for r in range(len(offsets) - 1):
        _request_distances(offsets, ids, weights, cap, unl, tree, last, tok_hist, pool_hist, st, r)
        start = st[CLOCK]  # times after this one were given by this request
        touched = 0  # distinct blocks this request touched so far: the newest times
        for p in range(offsets[r + 1] - 1, offsets[r] - 1, -1):  # tail first, so the head ends up most recent
            if st[CLOCK] == size:
                st[CLOCK] = _renumber(tree, last)
                start = st[CLOCK] - touched  # order is kept: this request's blocks hold the top ranks
            st[CLOCK] += 1
            blk = ids[p]
            t = last[blk]
            if t == 0:
                st[MARKED] += 1
                touched += 1
            else:
                if t > start:
                    st[RISK] = -1  # listed twice in one request: its second listing is a second copy
                else:
                    touched += 1
                i = t
                while i <= size:
                    tree[i] -= 1
                    i += i & -i
            i = st[CLOCK]
            while i <= size:
                tree[i] += 1
                i += i & -i
            last[blk] = st[CLOCK]


class FastPool(NamedTuple):
    """The pool's hit tokens at sizes lo..hi from the histogram; `at(N)` for N in that range."""

    cum: np.ndarray  # cum[c] = pool-histogram weight below c
    lo: int
    hi: int

    def covers(self, n: int) -> bool:
        return self.lo <= n <= self.hi

    def at(self, n: int) -> int:
        return int(self.cum[min(n - 1, len(self.cum) - 1)])


def fast_pool(pool_hist: np.ndarray, st: np.ndarray, most_blocks: int) -> FastPool:
    """The exact range and the cumulative histogram once every request was fed; `most_blocks`: the most
    blocks one request occupies (listed plus unlisted)."""
    cum = np.zeros(len(pool_hist) + 1, np.int64)
    np.cumsum(pool_hist, out=cum[1:])
    risk = int(st[RISK])
    hi = risk + 1 if risk < NO_RISK else np.iinfo(np.int64).max
    return FastPool(cum, int(most_blocks) + 1, hi)


def lru_pool_curves(offsets: np.ndarray, ids: np.ndarray, weights: np.ndarray, n_distinct: int,
                    prompts: np.ndarray, block_size: int, rule: str) -> tuple[np.ndarray, FastPool]:
    """(the keyed LRU hit tokens for every capacity c = 0..n_distinct, as the tests' `lru_stack.lru_curves`, and the
    pool's hit at every size in its exact range), in one pass over the requests."""

    cap, unl = request_shape(offsets, prompts, block_size, rule)
    most_u = int(unl.max()) if len(unl) else 0
    tree = np.zeros(min(lru_tree_slots(n_distinct), len(ids)) + 1, np.int32)
    last = np.zeros(n_distinct, np.int32)
    tok_hist = np.zeros(n_distinct + 1, np.int64)
    pool_hist = np.zeros(n_distinct + most_u + 1, np.int64)
    st = new_st()
    _lru_pool_chunk(offsets, ids, weights, cap, unl, tree, last, tok_hist, pool_hist, st)
    keyed = np.zeros(n_distinct + 1, np.int64)
    np.cumsum(tok_hist[:n_distinct], out=keyed[1:])
    most = int((np.diff(offsets) + unl).max()) if len(unl) else 0
    return keyed, fast_pool(pool_hist, st, most)


def merged(fast: FastPool, simulate: Callable[[Sequence[int]], Sequence[int] | np.ndarray],
           sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    """Hit tokens at each pool size: from the histogram where it is exact, simulated elsewhere."""
    sizes = [int(s) for s in sizes]
    out = np.array([fast.at(s) if fast.covers(s) else 0 for s in sizes], np.int64)
    rest = [i for i, s in enumerate(sizes) if not fast.covers(s)]
    if rest:
        out[rest] = np.asarray(simulate([sizes[i] for i in rest]), np.int64)
    return out
