"""Dense ids for 64-bit block hashes: every stage that indexes arrays by block uses these.

A compiled open-addressing hash table numbers distinct hashes in first-appearance order in one pass
(about 4x faster than Arrow's dictionary encoding and far faster than the sort inside `np.unique`).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _dense_ids_cap(flat, ids, cap, offsets, salts):  # noqa: ANN001, ANN202
    """Open-addressing pass with a table of `cap` slots; returns the distinct count or -1 if too full.
    With salts (one per CSR row of `offsets`), the key of a block is its hash xor its row's salt."""
    mask = cap - 1
    keys = np.zeros(cap, dtype=np.uint64)
    vals = np.full(cap, -1, dtype=np.int32)
    n = 0
    salted = len(salts) > 0
    row = 0
    for j in range(len(flat)):
        h = flat[j]
        if salted:
            while offsets[row + 1] <= j:
                row += 1
            h = h ^ salts[row]
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


def dense_ids(flat: np.ndarray, offsets: np.ndarray | None = None,
              salts: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Dense int32 ids of 64-bit hashes in first-appearance order (a hash table, O(n), not a sort).

    With `offsets` and `salts` (one per request), ids are those of `hash ^ salt of its request`, without
    materialising the salted hashes (a scope such as tenant or conversation, at no extra 16 bytes per block).
    """
    ids = np.zeros(len(flat), dtype=np.int32)
    if salts is None:
        offsets, salts = np.zeros(1, np.int64), np.zeros(0, np.uint64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    salts = np.ascontiguousarray(salts, dtype=np.uint64)
    cap = 1 << 16
    while True:
        n = _dense_ids_cap(np.ascontiguousarray(flat, dtype=np.uint64), ids, cap, offsets, salts)
        if n >= 0:
            return ids, int(n)
        cap <<= 2
