"""Dense ids for 64-bit block hashes: every stage that indexes arrays by block uses these.

A compiled open-addressing hash table numbers distinct hashes in first-appearance order in one pass
(about 4x faster than Arrow's dictionary encoding and far faster than the sort inside `np.unique`).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _dense_ids_cap(flat, ids, cap):  # noqa: ANN001, ANN202
    """Open-addressing pass with a table of `cap` slots; returns the distinct count or -1 if too full."""
    mask = cap - 1
    keys = np.zeros(cap, dtype=np.uint64)
    vals = np.full(cap, -1, dtype=np.int32)
    n = 0
    for j in range(len(flat)):
        h = flat[j]
        # splitmix64 finaliser spreads the (already random, but maybe remapped-small) hashes
        z = h ^ (h >> np.uint64(33))
        z = z * np.uint64(0xFF51AFD7ED558CCD)
        z = z ^ (z >> np.uint64(33))
        pos = np.int64(z & np.uint64(mask))
        while True:
            v = vals[pos]
            if v < 0:
                if 2 * (n + 1) > cap:
                    return -1
                keys[pos] = h
                vals[pos] = n
                ids[j] = n
                n += 1
                break
            if keys[pos] == h:
                ids[j] = v
                break
            pos = (pos + 1) & mask
    return n


def dense_ids(flat: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense int32 ids of 64-bit hashes in first-appearance order (a hash table, O(n), not a sort)."""
    ids = np.zeros(len(flat), dtype=np.int32)
    cap = 1 << 16
    while True:
        n = _dense_ids_cap(np.ascontiguousarray(flat, dtype=np.uint64), ids, cap)
        if n >= 0:
            return ids, int(n)
        cap <<= 2
