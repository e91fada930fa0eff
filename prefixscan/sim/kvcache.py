"""Per-replica KV block pools with vLLM v1 prefix-caching semantics, compiled with numba.

Each replica is vLLM's block pool (`tests/oracles/pool_ref.py` states the rules, from
vllm/v1/core/block_pool.py and kv_cache_manager.py; `tests/oracles/replica_ref.py` is the brute-force model the property
tests compare against). Physical blocks have identities, as in the engine:
- block 0 is the null block: a pool of N blocks holds at most N - 1;
- a request's block table holds its hit blocks (pinned: ref counts), then new blocks for the rest of its
  prompt, its partial last block and its reserved decode blocks, taken from the head of the free queue
  (a taken block that held a hash loses it: lazy eviction); every new full block gets its hash, even if
  another block holds it (after a capped full hit the recomputed last block is a second copy);
- on finish the table is freed in reverse order: blocks no longer used that hold a hash go to the tail
  of the LRU free queue, so a chain's tail is evicted before its head, and blocks without a hash
  (partial, unused decode blocks) to its front, reused first; generated tokens that filled a block get
  its hash first (`release_gen`).
Every path that frees a block frees its parent after it, so the hashes held stay prefix-closed per chain
and the hit length is found by binary search.

State for R replicas over U distinct blocks and pools of N blocks: `res[r, b]` (block b is cached; a
transposed view of block-major memory, read by matching), `kf[r, b]` = (first copy, last copy) slots of
block b, and one 24-byte record per slot `sl[r, s]` = (block + 1, prev, next slot in the free queue,
next copy of the same block, ref count, release time as float32 bits); slot 0 is the null block, so 0
means "none" in every link. Never-used slots are the ones above `USED` (vLLM's free queue starts with
them, in id order, so they are always taken first). Per-replica scalars `meta[r]` = (head, tail, used,
usable slots N - 1, slots in the free queue).
"""

from __future__ import annotations

import numpy as np
from numba import njit

HEAD, TAIL, USED, CAP, NFREE = 0, 1, 2, 3, 4
KEY, PRV, NXT, CNX, SREF, REL = 0, 1, 2, 3, 4, 5
FIRST, LAST = 0, 1
N_AGE_BUCKETS = 40  # log2 buckets of evicted-block age in ms: bucket i holds [2^(i-1), 2^i) ms


class KVState:
    """Arrays for R replicas; every operation is a compiled kernel below."""

    def __init__(self, replicas: int, n_blocks: int, capacity: int,
                 zeroed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """`capacity`: blocks per replica including the null block. `zeroed`: optional (res [blocks,
        replicas] int8 and kf [replicas, blocks, 2] int32, all zero; sl [replicas, capacity, 6] int32, any
        content: a slot's record is written when the slot is first used) to use instead of allocating (the
        compiled replay reuses them across replays)."""
        r, u, n = replicas, max(n_blocks, 1), max(capacity, 1)
        res, kf, sl = zeroed if zeroed is not None else (None, None, None)
        # indexed res[r, b] everywhere, stored block-major: matching one request probes the same blocks on
        # every replica, so those bytes share cache lines
        self.res = (np.zeros((u, r), dtype=np.int8) if res is None else res).T
        self.kf = np.zeros((r, u, 2), dtype=np.int32) if kf is None else kf
        self.sl = np.empty((r, n, 6), dtype=np.int32) if sl is None else sl  # never-used slots: not read
        self.slf = self.sl.view(np.float32)  # column REL read as float32: last release time
        self.meta = np.zeros((r, 5), dtype=np.int64)
        self.meta[:, CAP] = n - 1
        self.evictions = np.zeros(r, dtype=np.int64)
        self.evict_age_sum = np.zeros(r, dtype=np.float64)
        self.evict_hist = np.zeros((r, N_AGE_BUCKETS), dtype=np.int64)
        self.scratch = np.zeros(max(u, n) + 8, dtype=np.int32)  # ids evicted by the last admit / clear

    def match(self, r: int, blocks: np.ndarray) -> int:
        return int(match_len(self.res, r, blocks))

    def match_all(self, blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
        match_all(self.res, blocks, out)
        return out

    def admit(self, r: int, blocks: np.ndarray, max_hit: int, total: int, now: float,
              table: np.ndarray) -> tuple[int, int]:
        """Start a request: `blocks` its full prompt blocks, at most `max_hit` of them may hit, `total`
        blocks in its table (full, partial and reserved), written to `table`. Returns (hit blocks, ids
        evicted into `scratch`) or (-1, 0) when memory is short."""
        return admit(self.res, self.kf, self.sl, self.slf, self.meta, self.evictions, self.evict_age_sum,
                     self.evict_hist, self.scratch, r, blocks, max_hit, total, now, table)

    def release(self, r: int, table: np.ndarray, now: float) -> None:
        release(self.sl, self.slf, self.meta, r, table, now)

    def release_gen(self, r: int, table: np.ndarray, first_gen: int, gen: np.ndarray, now: float) -> int:
        """Give table blocks first_gen.. the hashes `gen` (generated tokens filled them), then release;
        returns how many ids became cached (in `scratch`)."""
        return int(release_gen(self.res, self.kf, self.sl, self.slf, self.meta, self.scratch, r, table,
                               first_gen, gen, now))

    def clear_free(self, r: int) -> int:
        """Drop the hash of every free block of replica r (a restart); returns how many ids are no longer
        cached (in `scratch`)."""
        return int(clear_free(self.res, self.kf, self.sl, self.meta, self.scratch, r))

    def available(self, r: int) -> int:
        return int(available(self.meta, r))


@njit(cache=True)
def available(meta, r):
    """Blocks replica r can still allocate: the never-used slots and the free queue (cached ones included)."""
    return meta[r, CAP] - meta[r, USED] + meta[r, NFREE]


@njit(cache=True)
def decode_steps(output_tokens):
    """Engine steps that decode a request of `output_tokens` outputs (ints or arrays): its first token comes
    out of the prefill and each step feeds the token before it back, so the last generated token's KV is
    never computed. The decode time is these steps; the KV a request holds is `kv_tokens`."""
    return np.maximum(output_tokens - 1, 0)


@njit(cache=True)
def kv_tokens(prompt_tokens, output_tokens):
    """Tokens whose KV a request holds when it finishes: its prompt plus one per decode step (prompt +
    output - 1; the last generated token is never fed back)."""
    return prompt_tokens + decode_steps(output_tokens)


@njit(cache=True)
def generated_blocks(wb, s, nb, sj, nbj, prompt_tokens, output_tokens, block_size):
    """How many of the next turn's listed blocks (wb[sj:sj + nbj]) a request (its nb blocks at wb[s:])
    filled as it generated: the next turn's blocks within its `kv_tokens`, provided that turn extends its
    prompt (chained hashes: an equal last block means an equal prefix). 0 when the answer filled none
    (both replay engines cache those blocks at release, with `release_gen`)."""
    m = min(nbj, kv_tokens(prompt_tokens, output_tokens) // block_size)
    return m if m > nb and (nb == 0 or wb[sj + nb - 1] == wb[s + nb - 1]) else 0


@njit(cache=True)
def match_len(res, r, blocks, above=0):
    """Leading `blocks` whose entry in row r of `res` is above `above`, by binary search (every view is
    prefix-closed): a resident set (0/1) by default, or an approximate view's last-routed times above
    now - TTL."""
    lo, hi = 0, len(blocks)
    while lo < hi:
        mid = (lo + hi) // 2
        if res[r, blocks[mid]] > above:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def match_all(res, blocks, out, above=0):
    """`match_len` for every replica, into out."""
    for r in range(res.shape[0]):
        out[r] = match_len(res, r, blocks, above)


@njit(cache=True, inline="always")
def _unlink(sl, meta, r, s):
    p, q = sl[r, s, PRV], sl[r, s, NXT]
    if p:
        sl[r, p, NXT] = q
    else:
        meta[r, HEAD] = q
    if q:
        sl[r, q, PRV] = p
    else:
        meta[r, TAIL] = p
    sl[r, s, PRV] = 0
    sl[r, s, NXT] = 0
    meta[r, NFREE] -= 1


@njit(cache=True, inline="always")
def _link(sl, meta, r, s, at_tail):
    """Put slot s at the tail of the free queue (evicted last) or at its head (reused first)."""
    p, q = (meta[r, TAIL], 0) if at_tail else (0, meta[r, HEAD])
    sl[r, s, PRV] = p
    sl[r, s, NXT] = q
    if p:
        sl[r, p, NXT] = s
    else:
        meta[r, HEAD] = s
    if q:
        sl[r, q, PRV] = s
    else:
        meta[r, TAIL] = s
    meta[r, NFREE] += 1


@njit(cache=True, inline="always")
def _drop(res, kf, sl, r, s):
    """Slot s loses its hash; returns the id if that was its last copy (no longer cached), else -1."""
    b = sl[r, s, KEY] - 1
    if b < 0:
        return -1
    sl[r, s, KEY] = 0
    if kf[r, b, FIRST] == s:
        kf[r, b, FIRST] = sl[r, s, CNX]
        if sl[r, s, CNX] == 0:
            kf[r, b, LAST] = 0
    else:
        p = kf[r, b, FIRST]
        while sl[r, p, CNX] != s:
            p = sl[r, p, CNX]
        sl[r, p, CNX] = sl[r, s, CNX]
        if kf[r, b, LAST] == s:
            kf[r, b, LAST] = p
    sl[r, s, CNX] = 0
    if kf[r, b, FIRST] == 0:
        res[r, b] = 0
        return b
    return -1


@njit(cache=True, inline="always")
def _cache(res, kf, sl, r, s, b):
    """Slot s gets id b's hash, as its last copy; returns True if b was not cached before."""
    sl[r, s, KEY] = b + 1
    sl[r, s, CNX] = 0
    last = kf[r, b, LAST]
    kf[r, b, LAST] = s
    if last:
        sl[r, last, CNX] = s
        return False
    kf[r, b, FIRST] = s
    res[r, b] = 1
    return True


@njit(cache=True, inline="always")
def _take_slot(res, kf, sl, slf, meta, evictions, age_sum, hist, scratch, r, now, ne):
    """A slot for a new block: a never-used one while any remain, else the free queue's head, whose hash
    (if any) is dropped. Returns (slot, ids evicted so far)."""
    if meta[r, USED] < meta[r, CAP]:
        meta[r, USED] += 1
        s = meta[r, USED]
        for f in range(REL):  # a never-used slot's record may be uninitialised memory (`KVState`)
            sl[r, s, f] = 0
        return s, ne
    s = meta[r, HEAD]
    _unlink(sl, meta, r, s)
    b = _drop(res, kf, sl, r, s)
    if b >= 0:
        age = now - slf[r, s, REL]
        evictions[r] += 1
        age_sum[r] += age
        ms = age * 1000.0
        k = 0
        while ms >= 1.0 and k < hist.shape[1] - 1:
            ms /= 2.0
            k += 1
        hist[r, k] += 1
        scratch[ne] = b
        ne += 1
    return s, ne


@njit(cache=True)
def admit(res, kf, sl, slf, meta, evictions, age_sum, hist, scratch, r, blocks, max_hit, total, now, table):
    k = min(match_len(res, r, blocks), max(max_hit, 0))
    hit_free = 0
    for i in range(k):
        if sl[r, kf[r, blocks[i], FIRST], SREF] == 0:
            hit_free += 1
    if total - k + hit_free > available(meta, r):
        return -1, 0
    for i in range(k):  # touch the hits (the first copy of each)
        s = kf[r, blocks[i], FIRST]
        if sl[r, s, SREF] == 0:
            _unlink(sl, meta, r, s)
        sl[r, s, SREF] += 1
        table[i] = s
    ne = 0
    for i in range(k, total):
        s, ne = _take_slot(res, kf, sl, slf, meta, evictions, age_sum, hist, scratch, r, now, ne)
        sl[r, s, SREF] = 1
        table[i] = s
    for i in range(k, min(len(blocks), total)):  # new full blocks get their hash, duplicates included
        _cache(res, kf, sl, r, table[i], blocks[i])
    m = 0
    for j in range(ne):  # an id evicted and cached again by this request is not reported evicted
        if res[r, scratch[j]] == 0:
            scratch[m] = scratch[j]
            m += 1
    return k, m


@njit(cache=True)
def release(sl, slf, meta, r, table, now):
    """Free a block table in reverse order (tail blocks become the oldest); a block without a hash goes to
    the front of the free queue instead (vLLM reuses those first)."""
    for i in range(len(table) - 1, -1, -1):
        s = table[i]
        sl[r, s, SREF] -= 1
        if sl[r, s, SREF] == 0:
            slf[r, s, REL] = now
            _link(sl, meta, r, s, sl[r, s, KEY] != 0)


@njit(cache=True)
def clear_free(res, kf, sl, meta, scratch, r):
    n = 0
    s = meta[r, HEAD]
    while s:
        b = _drop(res, kf, sl, r, s)
        if b >= 0:
            scratch[n] = b
            n += 1
        s = sl[r, s, NXT]
    return n


@njit(cache=True)
def release_gen(res, kf, sl, slf, meta, scratch, r, table, first_gen, gen, now):
    """Release like `release`, but first give the blocks that generated tokens filled their hashes.

    vLLM caches generated tokens once they fill a block, so the next turn of a conversation can hit the
    previous answer (docs/engines.md, 'The block pool'). `gen` are the hashes of those blocks in chain order; they go to
    table positions first_gen, first_gen + 1, ... (the partial prompt block first, then decode blocks).
    Returns how many ids became cached (ids in `scratch`).
    """
    stored = 0
    for j in range(min(len(gen), len(table) - first_gen)):
        if _cache(res, kf, sl, r, table[first_gen + j], gen[j]):
            scratch[stored] = gen[j]
            stored += 1
    release(sl, slf, meta, r, table, now)
    return stored
