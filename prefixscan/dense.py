"""Dense ids for 64-bit block hashes: every stage that indexes arrays by block uses these.

A compiled open-addressing hash table numbers distinct hashes in first-appearance order (about 4x faster
than Arrow's dictionary encoding and far faster than the sort inside `np.unique`). `DenseTable` keeps the
table between calls, so a log analysed chunk by chunk gets exactly the ids of the whole log at once while
memory grows only with the distinct blocks (12 bytes a slot, at most 1/MAX_LOAD slots a block).
"""

from __future__ import annotations

import numpy as np
from numba import njit

MAX_LOAD = 0.7  # linear probing with a well-mixed hash stays short up to ~70% full
GROWTH = 1.3  # small steps: the table is the largest per-block structure of a long log, and while it
# grows the old and the new table are both alive
MIN_SLOTS = 1 << 16


@njit(cache=True, nogil=True, inline="always")
def _slot(h, cap):  # pragma: no cover - compiled
    """Home slot of a key: the splitmix64 finaliser spreads (possibly small, remapped) hashes, then the top
    32 bits are scaled to [0, cap) (Lemire's multiply-shift), so the table need not be a power of two."""
    z = h ^ (h >> np.uint64(33))
    z = z * np.uint64(0xFF51AFD7ED558CCD)
    z = z ^ (z >> np.uint64(33))
    return np.int64(((z >> np.uint64(32)) * np.uint64(cap)) >> np.uint64(32))


@njit(cache=True, nogil=True)
def _insert(keys, vals, n, limit, flat, ids, start, offsets, salts):  # pragma: no cover - compiled
    """Number flat[start:] into the table (key = hash, xor its row's salt when salts are given).

    Returns (distinct count, next position): it stops early, before adding the key that would pass
    `limit` entries, so the caller can grow the table and resume at that position."""
    cap = len(keys)
    salted = len(salts) > 0
    row = 0
    if salted:
        row = np.searchsorted(offsets, start, side="right") - 1
    for j in range(start, len(flat)):
        h = flat[j]
        if salted:
            while offsets[row + 1] <= j:
                row += 1
            h = h ^ salts[row]
        pos = _slot(h, cap)
        while True:
            v = vals[pos]
            if v < 0:
                if n >= limit:
                    return n, j
                keys[pos] = h
                vals[pos] = n
                ids[j] = n
                n += 1
                break
            if keys[pos] == h:
                ids[j] = v
                break
            pos += 1
            if pos == cap:
                pos = 0
    return n, len(flat)


@njit(cache=True, nogil=True)
def _rehash(keys, vals, new_keys, new_vals):  # pragma: no cover - compiled
    cap = len(new_keys)
    for i in range(len(keys)):
        v = vals[i]
        if v < 0:
            continue
        h = keys[i]
        pos = _slot(h, cap)
        while new_vals[pos] >= 0:
            pos += 1
            if pos == cap:
                pos = 0
        new_keys[pos] = h
        new_vals[pos] = v


class DenseTable:
    """Hash -> dense int32 id in first-appearance order, kept across calls (a log read in chunks)."""

    def __init__(self, slots: int = MIN_SLOTS) -> None:
        self.keys = np.zeros(max(int(slots), 16), dtype=np.uint64)
        self.vals = np.full(len(self.keys), -1, dtype=np.int32)
        self.n = 0

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes

    def copy(self) -> DenseTable:
        """An independent table with the same contents (a scope that starts as the whole log so far)."""
        out = DenseTable.__new__(DenseTable)
        out.keys, out.vals, out.n = self.keys.copy(), self.vals.copy(), self.n
        return out

    def _grow(self) -> None:
        cap = int(len(self.keys) * GROWTH) + 1
        new_keys = np.zeros(cap, dtype=np.uint64)
        new_vals = np.full(cap, -1, dtype=np.int32)
        _rehash(self.keys, self.vals, new_keys, new_vals)
        self.keys, self.vals = new_keys, new_vals

    def ids(self, flat: np.ndarray, offsets: np.ndarray | None = None, salts: np.ndarray | None = None) -> np.ndarray:
        """Dense ids of `flat` (of `hash ^ salt of its CSR row` with offsets and salts), adding new hashes."""
        flat = np.ascontiguousarray(flat, dtype=np.uint64)
        out = np.zeros(len(flat), dtype=np.int32)
        if salts is None:
            offsets, salts = np.zeros(1, np.int64), np.zeros(0, np.uint64)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        salts = np.ascontiguousarray(salts, dtype=np.uint64)
        at = 0
        while True:
            limit = int(len(self.keys) * MAX_LOAD)
            self.n, at = _insert(self.keys, self.vals, self.n, limit, flat, out, at, offsets, salts)
            if at >= len(flat):
                if self.n >= 2**31 - 1:
                    raise OverflowError("more than 2^31 distinct blocks")
                return out
            self._grow()


def dense_ids(flat: np.ndarray, offsets: np.ndarray | None = None,
              salts: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Dense int32 ids of 64-bit hashes in first-appearance order (a hash table, O(n), not a sort).

    With `offsets` and `salts` (one per request), ids are those of `hash ^ salt of its request`, without
    materialising the salted hashes (a scope such as tenant or conversation, at no extra 16 bytes per block).
    """
    table = DenseTable()
    ids = table.ids(flat, offsets, salts)
    return ids, table.n
