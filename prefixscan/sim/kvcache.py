"""Per-replica KV block caches with vLLM v1 prefix-caching semantics, compiled with numba.

The rules (REFERENCE.md 1, vllm/v1/core/block_pool.py and kv_cache_utils.py):
- a request pins the blocks it uses (ref counts) for as long as it runs;
- on finish its blocks go to the tail of an LRU free queue *in reverse order*, so a chain's tail is
  evicted before its head;
- eviction is lazy: a freed block stays hittable until its slot is needed for a new block.
Together these keep every replica's cached set prefix-closed per chain (a block is only resident while
its parent is), so the hit length is found by binary search over the request's blocks. `reference.py`
is the brute-force model the property tests compare against.

State for R replicas over U distinct blocks lives in [R, U] arrays; the free queue is a doubly linked
list threaded through `prv`/`nxt`, exactly like vLLM's FreeKVCacheBlockQueue. Per-replica scalars live
in `meta[r]` = (head, tail, used, capacity, n_free). `used` counts resident blocks plus reserved decode
blocks; the replica is full when used == capacity.
"""

from __future__ import annotations

import numpy as np
from numba import njit

HEAD, TAIL, USED, CAP, NFREE = 0, 1, 2, 3, 4
N_AGE_BUCKETS = 40  # log2 buckets of evicted-block age in ms: bucket i holds [2^(i-1), 2^i) ms


class KVState:
    """Arrays for R replicas; every operation is a compiled kernel below."""

    def __init__(self, replicas: int, n_blocks: int, capacity: int) -> None:
        r, u = replicas, max(n_blocks, 1)
        self.res = np.zeros((r, u), dtype=np.int8)
        self.ref = np.zeros((r, u), dtype=np.int32)
        self.prv = np.full((r, u), -1, dtype=np.int32)
        self.nxt = np.full((r, u), -1, dtype=np.int32)
        self.rel = np.zeros((r, u), dtype=np.float32)
        self.meta = np.zeros((r, 5), dtype=np.int64)
        self.meta[:, HEAD] = -1
        self.meta[:, TAIL] = -1
        self.meta[:, CAP] = capacity
        self.evictions = np.zeros(r, dtype=np.int64)
        self.evict_age_sum = np.zeros(r, dtype=np.float64)
        self.evict_hist = np.zeros((r, N_AGE_BUCKETS), dtype=np.int64)
        self.scratch = np.zeros(u + 8, dtype=np.int32)  # evicted ids of the last admit

    def match(self, r: int, blocks: np.ndarray) -> int:
        return int(match_len(self.res, r, blocks))

    def match_all(self, blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
        match_all(self.res, blocks, out)
        return out

    def admit(self, r: int, blocks: np.ndarray, extra: int, now: float) -> tuple[int, int]:
        """Pin a request's blocks; returns (matched blocks, evicted count) or (-1, 0) if memory is short."""
        k, ne = admit(self.res, self.ref, self.prv, self.nxt, self.rel, self.meta, self.evictions,
                      self.evict_age_sum, self.evict_hist, self.scratch, r, blocks, extra, now)
        return int(k), int(ne)

    def release(self, r: int, blocks: np.ndarray, extra: int, now: float) -> None:
        release(self.ref, self.prv, self.nxt, self.rel, self.meta, r, blocks, extra, now)

    def clear_free(self, r: int) -> int:
        """Drop every unpinned cached block of replica r (a restart); returns how many."""
        return int(clear_free(self.res, self.prv, self.nxt, self.meta, r))

    def available(self, r: int) -> int:
        m = self.meta[r]
        return int(m[CAP] - m[USED] + m[NFREE])

    def resident_count(self, r: int) -> int:
        return int(self.res[r].sum())


@njit(cache=True)
def match_len(res, r, blocks):  # noqa: ANN001, ANN201
    lo, hi = 0, len(blocks)
    while lo < hi:
        mid = (lo + hi) // 2
        if res[r, blocks[mid]]:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def match_all(res, blocks, out):  # noqa: ANN001, ANN201
    for r in range(res.shape[0]):
        out[r] = match_len(res, r, blocks)


@njit(cache=True)
def ideal_match(offsets, blocks, n_unique):  # noqa: ANN001, ANN201
    """Unbounded single cache in request order: the ideal-cache hit in blocks."""
    seen = np.zeros(max(n_unique, 1), dtype=np.int8)
    n = len(offsets) - 1
    out = np.zeros(n, dtype=np.int32)
    for i in range(n):
        s, e = offsets[i], offsets[i + 1]
        lo, hi = 0, e - s
        while lo < hi:
            mid = (lo + hi) // 2
            if seen[blocks[s + mid]]:
                lo = mid + 1
            else:
                hi = mid
        out[i] = lo
        for j in range(s + lo, e):
            seen[blocks[j]] = 1
    return out


@njit(cache=True)
def _unlink(prv, nxt, meta, r, b):  # noqa: ANN001, ANN202
    p, q = prv[r, b], nxt[r, b]
    if p >= 0:
        nxt[r, p] = q
    else:
        meta[r, HEAD] = q
    if q >= 0:
        prv[r, q] = p
    else:
        meta[r, TAIL] = p
    prv[r, b] = -1
    nxt[r, b] = -1
    meta[r, NFREE] -= 1


@njit(cache=True)
def _append(prv, nxt, meta, r, b):  # noqa: ANN001, ANN202
    t = meta[r, TAIL]
    prv[r, b] = t
    nxt[r, b] = -1
    if t >= 0:
        nxt[r, t] = b
    else:
        meta[r, HEAD] = b
    meta[r, TAIL] = b
    meta[r, NFREE] += 1


@njit(cache=True)
def _take_slot(res, prv, nxt, rel, meta, evictions, age_sum, hist, scratch, r, now, ne):  # noqa: ANN001, ANN202
    """One free slot for a new block: an empty one while any remain, else evict the LRU head."""
    if meta[r, USED] < meta[r, CAP]:
        meta[r, USED] += 1
        return ne
    b = meta[r, HEAD]
    _unlink(prv, nxt, meta, r, b)
    res[r, b] = 0
    age = now - rel[r, b]
    evictions[r] += 1
    age_sum[r] += age
    ms = age * 1000.0
    k = 0
    while ms >= 1.0 and k < hist.shape[1] - 1:
        ms /= 2.0
        k += 1
    hist[r, k] += 1
    scratch[ne] = b
    return ne + 1


@njit(cache=True)
def admit(res, ref, prv, nxt, rel, meta, evictions, age_sum, hist, scratch, r, blocks, extra, now):  # noqa: ANN001, ANN201
    k = match_len(res, r, blocks)
    hit_free = 0
    for i in range(k):
        if ref[r, blocks[i]] == 0:
            hit_free += 1
    need = len(blocks) - k + extra
    if need > meta[r, CAP] - meta[r, USED] + meta[r, NFREE] - hit_free:
        return -1, 0
    for i in range(k):
        b = blocks[i]
        if ref[r, b] == 0:
            _unlink(prv, nxt, meta, r, b)
        ref[r, b] += 1
    ne = 0
    for i in range(k, len(blocks)):
        ne = _take_slot(res, prv, nxt, rel, meta, evictions, age_sum, hist, scratch, r, now, ne)
        b = blocks[i]
        res[r, b] = 1
        ref[r, b] = 1
    for _ in range(extra):
        ne = _take_slot(res, prv, nxt, rel, meta, evictions, age_sum, hist, scratch, r, now, ne)
    return k, ne


@njit(cache=True)
def release(ref, prv, nxt, rel, meta, r, blocks, extra, now):  # noqa: ANN001, ANN201
    for i in range(len(blocks) - 1, -1, -1):  # reverse order: tail blocks become the oldest
        b = blocks[i]
        ref[r, b] -= 1
        if ref[r, b] == 0:
            rel[r, b] = now
            _append(prv, nxt, meta, r, b)
    meta[r, USED] -= extra


@njit(cache=True)
def clear_free(res, prv, nxt, meta, r):  # noqa: ANN001, ANN201
    n = 0
    b = meta[r, HEAD]
    while b >= 0:
        q = nxt[r, b]
        prv[r, b] = -1
        nxt[r, b] = -1
        res[r, b] = 0
        n += 1
        b = q
    meta[r, HEAD] = -1
    meta[r, TAIL] = -1
    meta[r, NFREE] = 0
    meta[r, USED] -= n
    return n
