"""Per-replica KV block caches with vLLM v1 prefix-caching semantics, compiled with numba.

The rules (REFERENCE.md 1, vllm/v1/core/block_pool.py and kv_cache_utils.py):
- a request pins the blocks it uses (ref counts) for as long as it runs;
- on finish its blocks go to the tail of an LRU free queue *in reverse order*, so a chain's tail is
  evicted before its head;
- eviction is lazy: a freed block stays hittable until its slot is needed for a new block.
Together these keep every replica's cached set prefix-closed per chain (a block is only resident while
its parent is), so the hit length is found by binary search over the request's blocks. `reference.py`
is the brute-force model the property tests compare against.

State for R replicas over U distinct blocks: `res[r, b]` (resident, read by matching; a transposed view
of block-major memory) and one 16-byte
record per block `node[r, b]` = (ref count, prev + 1, next + 1, release time as float32 bits), so a
block's bookkeeping shares one cache line. The free queue is a doubly linked list threaded through the
records, exactly like vLLM's FreeKVCacheBlockQueue. Per-replica scalars live in `meta[r]` = (head,
tail, used, capacity, n_free). `used` counts resident blocks plus reserved decode blocks; the replica is
full when used == capacity.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixscan.dense import dense_ids  # noqa: F401 - re-exported for the simulator's callers

HEAD, TAIL, USED, CAP, NFREE = 0, 1, 2, 3, 4
N_AGE_BUCKETS = 40  # log2 buckets of evicted-block age in ms: bucket i holds [2^(i-1), 2^i) ms


class KVState:
    """Arrays for R replicas; every operation is a compiled kernel below."""

    def __init__(
        self, replicas: int, n_blocks: int, capacity: int, zeroed: tuple[np.ndarray, np.ndarray] | None = None
    ) -> None:
        """`zeroed`: optional all-zero (res [blocks, replicas] int8, node [replicas, blocks, 4] int32) to use
        instead of allocating (the compiled replay reuses them across replays)."""
        r, u = replicas, max(n_blocks, 1)
        res, node = zeroed if zeroed is not None else (None, None)
        # indexed res[r, b] everywhere, stored block-major: matching one request probes the same blocks on
        # every replica, so those bytes share cache lines
        self.res = (np.zeros((u, r), dtype=np.int8) if res is None else res).T
        self.node = np.zeros((r, u, 4), dtype=np.int32) if node is None else node  # zeros = unreferenced, unlinked
        self.nodef = self.node.view(np.float32)  # slot 3 read as float32: last release time
        self.meta = np.zeros((r, 5), dtype=np.int64)
        self.meta[:, HEAD] = -1
        self.meta[:, TAIL] = -1
        self.meta[:, CAP] = capacity
        self.evictions = np.zeros(r, dtype=np.int64)
        self.evict_age_sum = np.zeros(r, dtype=np.float64)
        self.evict_hist = np.zeros((r, N_AGE_BUCKETS), dtype=np.int64)
        self.scratch = np.zeros(u + 8, dtype=np.int32)  # evicted ids of the last admit

    @property
    def ref(self) -> np.ndarray:
        """Pin counts [R, U] (a view)."""
        return self.node[:, :, REF]

    def match(self, r: int, blocks: np.ndarray) -> int:
        return int(match_len(self.res, r, blocks))

    def match_all(self, blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
        match_all(self.res, blocks, out)
        return out

    def admit(self, r: int, blocks: np.ndarray, extra: int, now: float) -> tuple[int, int]:
        """Pin a request's blocks; returns (matched blocks, evicted count) or (-1, 0) if memory is short."""
        return admit(
            self.res,
            self.node,
            self.nodef,
            self.meta,
            self.evictions,
            self.evict_age_sum,
            self.evict_hist,
            self.scratch,
            r,
            blocks,
            extra,
            now,
        )

    def release(self, r: int, blocks: np.ndarray, extra: int, now: float) -> None:
        release(self.node, self.nodef, self.meta, r, blocks, extra, now)

    def release_gen(self, r: int, blocks: np.ndarray, gen: np.ndarray, extra: int, now: float) -> int:
        """Release and cache the generated blocks `gen`; returns how many were newly cached."""
        return int(
            release_gen(self.res, self.node, self.nodef, self.meta, self.scratch, r, blocks, gen, extra, now)
        )

    def clear_free(self, r: int) -> int:
        """Drop every unpinned cached block of replica r (a restart); returns how many."""
        return int(clear_free(self.res, self.node, self.meta, r))

    def available(self, r: int) -> int:
        m = self.meta[r]
        return int(m[CAP] - m[USED] + m[NFREE])

    def resident_count(self, r: int) -> int:
        return int(self.res[r].sum())


REF, PRV, NXT, REL = 0, 1, 2, 3


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
def _unlink(node, meta, r, b):  # noqa: ANN001, ANN202
    p, q = node[r, b, PRV] - 1, node[r, b, NXT] - 1
    if p >= 0:
        node[r, p, NXT] = q + 1
    else:
        meta[r, HEAD] = q
    if q >= 0:
        node[r, q, PRV] = p + 1
    else:
        meta[r, TAIL] = p
    node[r, b, PRV] = 0
    node[r, b, NXT] = 0
    meta[r, NFREE] -= 1


@njit(cache=True)
def _append(node, meta, r, b):  # noqa: ANN001, ANN202
    t = meta[r, TAIL]
    node[r, b, PRV] = t + 1
    node[r, b, NXT] = 0
    if t >= 0:
        node[r, t, NXT] = b + 1
    else:
        meta[r, HEAD] = b
    meta[r, TAIL] = b
    meta[r, NFREE] += 1


@njit(cache=True)
def _take_slot(res, node, nodef, meta, evictions, age_sum, hist, scratch, r, now, ne):  # noqa: ANN001, ANN202
    """One free slot for a new block: an empty one while any remain, else evict the LRU head."""
    if meta[r, USED] < meta[r, CAP]:
        meta[r, USED] += 1
        return ne
    b = meta[r, HEAD]
    _unlink(node, meta, r, b)
    res[r, b] = 0
    age = now - nodef[r, b, REL]
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
def admit(res, node, nodef, meta, evictions, age_sum, hist, scratch, r, blocks, extra, now):  # noqa: ANN001, ANN201
    k = match_len(res, r, blocks)
    hit_free = 0
    for i in range(k):
        if node[r, blocks[i], REF] == 0:
            hit_free += 1
    need = len(blocks) - k + extra
    if need > meta[r, CAP] - meta[r, USED] + meta[r, NFREE] - hit_free:
        return -1, 0
    for i in range(k):
        b = blocks[i]
        if node[r, b, REF] == 0:
            _unlink(node, meta, r, b)
        node[r, b, REF] += 1
    ne = 0
    for i in range(k, len(blocks)):
        ne = _take_slot(res, node, nodef, meta, evictions, age_sum, hist, scratch, r, now, ne)
        b = blocks[i]
        res[r, b] = 1
        node[r, b, REF] = 1
    for _ in range(extra):
        ne = _take_slot(res, node, nodef, meta, evictions, age_sum, hist, scratch, r, now, ne)
    return k, ne


@njit(cache=True)
def release(node, nodef, meta, r, blocks, extra, now):  # noqa: ANN001, ANN201
    for i in range(len(blocks) - 1, -1, -1):  # reverse order: tail blocks become the oldest
        b = blocks[i]
        node[r, b, REF] -= 1
        if node[r, b, REF] == 0:
            nodef[r, b, REL] = now
            _append(node, meta, r, b)
    meta[r, USED] -= extra


@njit(cache=True)
def clear_free(res, node, meta, r):  # noqa: ANN001, ANN201
    n = 0
    b = meta[r, HEAD]
    while b >= 0:
        q = node[r, b, NXT] - 1
        node[r, b, PRV] = 0
        node[r, b, NXT] = 0
        res[r, b] = 0
        n += 1
        b = q
    meta[r, HEAD] = -1
    meta[r, TAIL] = -1
    meta[r, NFREE] = 0
    meta[r, USED] -= n
    return n


@njit(cache=True)
def release_gen(res, node, nodef, meta, scratch, r, blocks, gen, extra, now):  # noqa: ANN001, ANN201
    """Release like `release`, but first turn reserved decode slots into cached blocks `gen`.

    vLLM caches generated tokens once they fill a block, so the next turn of a conversation can hit the
    previous answer (REFERENCE.md 1). `gen` are the hashes of those blocks in chain order (they extend
    `blocks`); each takes over one reserved decode slot. Returns how many were newly cached (ids in
    `scratch`).
    """
    m = min(len(gen), extra)
    stored = 0
    for i in range(m - 1, -1, -1):  # the whole block table is released tail first
        b = gen[i]
        if res[r, b] == 0:
            res[r, b] = 1
            node[r, b, REF] = 0
            nodef[r, b, REL] = now
            _append(node, meta, r, b)
            scratch[stored] = b
            stored += 1
        elif node[r, b, REF] == 0:  # cached and free: touched again
            _unlink(node, meta, r, b)
            nodef[r, b, REL] = now
            _append(node, meta, r, b)
    release(node, nodef, meta, r, blocks, extra - stored, now)
    return stored
