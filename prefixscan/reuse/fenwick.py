"""The Fenwick tree over virtual access times that the one-pass LRU kernels share (`pool_fast._lru_pool_chunk`,
`capacity_stream`; the tests' `tests/oracles/lru_stack.py`): renumbering the marks when the clock reaches
the end lets a tree of O(distinct) slots serve any number of accesses.
"""

from __future__ import annotations

from numba import njit


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
