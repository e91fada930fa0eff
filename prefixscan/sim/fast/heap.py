"""A binary min-heap of engine events in arrays, ordered like the reference's (time, kind, counter) tuples.

`hm[j]` = (kind * 2^42 + counter, replica, request): (time, packed key) compares exactly as heapq compares
the tuples, and counters are unique, so events pop in the reference's order whatever the heap layout.
"""

from __future__ import annotations

from numba import njit

KIND_SHIFT = 1 << 42


@njit(cache=True)
def _less(ht, hm, a, b):
    return ht[a] < ht[b] or (ht[a] == ht[b] and hm[a, 0] < hm[b, 0])


@njit(cache=True)
def _swap(ht, hm, a, b):
    ht[a], ht[b] = ht[b], ht[a]
    for c in range(3):
        hm[a, c], hm[b, c] = hm[b, c], hm[a, c]


@njit(cache=True)
def push(ht, hm, size, t, kind, counter, r, i):
    """Insert an event; returns the new size."""
    j = size
    ht[j] = t
    hm[j, 0] = kind * KIND_SHIFT + counter
    hm[j, 1] = r
    hm[j, 2] = i
    while j > 0:
        parent = (j - 1) // 2
        if not _less(ht, hm, j, parent):
            break
        _swap(ht, hm, j, parent)
        j = parent
    return size + 1


@njit(cache=True)
def pop(ht, hm, size):
    """Remove the earliest event; returns (time, kind, replica, request, new size)."""
    t, kind, r, i = ht[0], hm[0, 0] // KIND_SHIFT, hm[0, 1], hm[0, 2]
    size -= 1
    if size > 0:
        ht[0] = ht[size]
        for c in range(3):
            hm[0, c] = hm[size, c]
        j = 0
        while True:
            a, b, m = 2 * j + 1, 2 * j + 2, j
            if a < size and _less(ht, hm, a, m):
                m = a
            if b < size and _less(ht, hm, b, m):
                m = b
            if m == j:
                break
            _swap(ht, hm, j, m)
            j = m
    return t, kind, r, i, size
