"""Where the optimal cache provably equals the ideal one, so that it need not be simulated there.

Let S_r be the blocks whose request-granular lifetime [first listing, last listing] contains request r, and
L the largest |S_r|. With a capacity of at least L blocks, Belady's cache with bypass (`capacity._opt_chunk`)
never loses a hit: when it is full at an admission of request r, every resident block outside S_r is
never used again (counted as dead), and fewer than L resident blocks are in S_r (the incoming one is not
resident), so a dead block is the victim. The one other way it skips a block is the bypass of a block
never used again, which also stops admitting the rest of its request; that loses nothing if, in every
request, no block used again follows a block never used again (chained hashes guarantee it; it is
checked). Then every re-use hits, as in the infinite cache: OPT = ideal at every capacity >= L.
On the bench's 1M-request trace L is 51,772 blocks of a 2.9M working set: 9 of the 16 default grid
points, the most expensive ones, need no OPT run.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _last_use(offsets, ids, r0, last):  # pragma: no cover - compiled
    """last[b] = the (global) request that lists block b last, over one run of requests starting at r0."""
    for r in range(len(offsets) - 1):
        for p in range(offsets[r], offsets[r + 1]):
            last[ids[p]] = r0 + r


@njit(cache=True, nogil=True)
def _overlap(offsets, ids, r0, last, seen, st):  # pragma: no cover - compiled
    """One run of requests: st = [unused, live now, largest live, chained (1/0)]; consumes `last` (a
    block's entry is set to -1 once its lifetime ended) and marks `seen`."""
    for r in range(len(offsets) - 1):
        g = r0 + r
        ended = 0
        done = False  # a block never used again was met in this request
        for p in range(offsets[r], offsets[r + 1]):
            b = ids[p]
            if not seen[b]:  # a first listing
                seen[b] = True
                st[1] += 1
            lb = last[b]
            future = lb > g
            if future and done:
                st[3] = 0
            if not future:
                done = True
            if lb == g:
                last[b] = -1
                ended += 1
        if st[1] > st[2]:
            st[2] = st[1]
        st[1] -= ended


def new_bound_state() -> np.ndarray:
    st = np.zeros(4, np.int64)
    st[3] = 1
    return st


def opt_ideal_from(st: np.ndarray, n_distinct: int) -> int:
    """The least capacity (blocks held) from which OPT = ideal: L when chained, else the working set."""
    return min(int(st[2]), int(n_distinct)) if st[3] else int(n_distinct)


def opt_ideal_capacity(offsets: np.ndarray, ids: np.ndarray, n_distinct: int) -> int:
    """`opt_ideal_from` over requests held in memory (dense ids below n_distinct)."""
    last = np.full(max(n_distinct, 1), -1, np.int32)
    _last_use(offsets, ids, 0, last)
    st = new_bound_state()
    _overlap(offsets, ids, 0, last, np.zeros(max(n_distinct, 1), np.bool_), st)
    return opt_ideal_from(st, n_distinct)
