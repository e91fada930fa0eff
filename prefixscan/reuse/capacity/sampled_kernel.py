"""The compiled passes of `capacity.sampled`: every salt at once, resumable chunk by chunk, the hot part shared.

A kept reference's weighted distance splits in two: the distinct *hot* blocks used since its block's last
use (weight 1, the same for every salt) plus 1/R times the distinct *sampled* blocks used since (its own
salt's sample). One small Fenwick tree over the hot blocks' accesses serves all salts; each salt has a tree
over its own sampled accesses only (about R of all references). A block records, at its last use, its time
on its own tree and the other trees' clocks then; the blocks used since on a tree are that tree's marked
count minus its prefix count at the recorded clock.

What keeps the hot half of the log cheap (its references are about half of all):
- the hot set is a 4-slots-per-block hash table, not an array over every distinct block;
- a hot reference's sampled part is one prefix query per salt per *run* of hot blocks last used at the same
  clock (a system prompt is used as a whole, so its blocks share it), not per block;
- sampled blocks record the *global* count of hot accesses (G), never renumbered: the hot tree stays small
  (16 slots per hot block, in cache) and its renumbering touches only the hot blocks. After a renumbering
  the hot blocks' times are 1..m in the order of their last G (`relab`), so a G older than the renumbering
  maps to the number of hot blocks last used at or before it, and a newer G to base + (G - G0).
Per reference outside the hot set, the work is one hash probe and one splitmix64 per salt.

State (numba wants plain arrays): `st` = [marked_h, clock_h, G, G0, base]; per salt `sst` = [marked, clock].
"""

from __future__ import annotations

import numpy as np
from numba import njit

EMPTY = -1


@njit(cache=True, inline="always")
def _pref(tree, t):  # pragma: no cover - compiled
    s = 0
    while t > 0:
        s += tree[t]
        t -= t & -t
    return s


@njit(cache=True, inline="always")
def _add(tree, i, v):  # pragma: no cover - compiled
    n = len(tree) - 1
    while i <= n:
        tree[i] += v
        i += i & -i


@njit(cache=True, inline="always")
def _pref2(trees, s, t):  # pragma: no cover - compiled
    """_pref on row s of a 2-D array of trees (no row view: a view costs a reference count per use)."""
    v = 0
    while t > 0:
        v += trees[s, t]
        t -= t & -t
    return v


@njit(cache=True, inline="always")
def _add2(trees, s, i, v):  # pragma: no cover - compiled
    n = trees.shape[1] - 1
    while i <= n:
        trees[s, i] += v
        i += i & -i


@njit(cache=True, inline="always")
def _slot2(keys, s, blk, mask):  # pragma: no cover - compiled
    """_slot in row s of a 2-D table."""
    i = np.int64(splitmix64(np.uint64(blk) ^ _TABLE_KEY) & np.uint64(mask))
    while keys[s, i] != EMPTY and keys[s, i] != blk:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _ones(tree, m):  # pragma: no cover - compiled
    tree[0] = 0
    for i in range(1, len(tree)):
        tree[i] = max(0, min(i, m) - (i - (i & -i)))


@njit(cache=True, nogil=True, inline="always")
def splitmix64(x):  # pragma: no cover - compiled
    """splitmix64: a sampling key independent of how the keys were made (uint64 in, uint64 out)."""
    z = x
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_TABLE_KEY = np.uint64(0x9E3779B97F4A7C15)  # tables hash apart from the samples: a salt's kept blocks have
# small low bits of splitmix64(id ^ salt), and with salt 0 a table indexed by those bits clusters them all


@njit(cache=True, inline="always")
def _slot(keys, blk, mask):  # pragma: no cover - compiled
    """Open-addressed slot of block `blk` in a table of keys (EMPTY = free)."""
    i = np.int64(splitmix64(np.uint64(blk) ^ _TABLE_KEY) & np.uint64(mask))
    while keys[i] != EMPTY and keys[i] != blk:
        i = (i + 1) & mask
    return i


@njit(cache=True, inline="always")
def _hot_index(ht_keys, ht_val, blk):  # pragma: no cover - compiled
    q = _slot(ht_keys, blk, len(ht_keys) - 1)
    return ht_val[q] if ht_keys[q] == blk else -1


@njit(cache=True, inline="always")
def _kept_mask(blk, salts, threshold):  # pragma: no cover - compiled
    """Bit s set iff salt s's sample keeps block blk (hash mod 2^24 < threshold)."""
    low = np.uint64((1 << 24) - 1)
    m = 0
    for s in range(len(salts)):
        if (splitmix64(np.uint64(blk) ^ salts[s]) & low) < threshold:
            m |= 1 << s
    return m


# ---------------------------------------------------------------- hot candidates (Misra-Gries, then exact)


@njit(cache=True)
def _mg_shrink(keys, cnt, kk, cc):  # pragma: no cover - compiled
    """Misra-Gries' decrement-all: every counter loses 1, the zeros leave (survivors re-inserted; kk, cc
    are scratch of the table's size)."""
    mask = len(keys) - 1
    kk[:] = keys
    cc[:] = cnt
    keys[:] = EMPTY
    cnt[:] = 0
    left = 0
    for i in range(len(kk)):
        if kk[i] != EMPTY and cc[i] > 1:
            q = _slot(keys, kk[i], mask)
            keys[q] = kk[i]
            cnt[q] = cc[i] - 1
            left += 1
    return left


@njit(cache=True, nogil=True)
def mg_chunk(ids, keys, cnt, st, k):  # pragma: no cover - compiled
    """Misra-Gries with k counters over one chunk of ids (st[0] = counters in use): afterwards every block
    referenced more than N/(k+1) times of N is a key. The table has at least 2k slots."""
    mask = len(keys) - 1
    used = st[0]
    kk = np.empty_like(keys)
    cc = np.empty_like(cnt)
    for p in range(len(ids)):
        blk = np.int64(ids[p])
        q = _slot(keys, blk, mask)
        if keys[q] == blk:
            cnt[q] += 1
        elif used < k:
            keys[q] = blk
            cnt[q] = 1
            used += 1
        else:
            used = _mg_shrink(keys, cnt, kk, cc)
    st[0] = used


@njit(cache=True, nogil=True)
def count_chunk(ids, keys, cnt):  # pragma: no cover - compiled
    """Exact reference counts of the table's keys over one chunk."""
    mask = len(keys) - 1
    for p in range(len(ids)):
        q = _slot(keys, np.int64(ids[p]), mask)
        if keys[q] != EMPTY:
            cnt[q] += 1


@njit(cache=True, nogil=True)
def build_table(blks, size):  # pragma: no cover - compiled
    """An open-addressed table of `blks` (distinct) with values 0..len-1 in their order; size a power of 2."""
    keys = np.full(size, EMPTY, np.int64)
    val = np.full(size, -1, np.int64)
    for i in range(len(blks)):
        q = _slot(keys, blks[i], size - 1)
        keys[q] = blks[i]
        val[q] = i
    return keys, val


@njit(cache=True, nogil=True)
def kept_distinct(n, ht_keys, ht_val, salts, threshold, out):  # pragma: no cover - compiled
    """out[s] = blocks below n that salt s keeps outside the hot set: what sizes its table and tree."""
    for blk in range(n):
        if _hot_index(ht_keys, ht_val, blk) >= 0:
            continue
        m = _kept_mask(blk, salts, threshold)
        for s in range(len(salts)):
            if m >> s & 1:
                out[s] += 1


@njit(cache=True, nogil=True)
def ideal_chunk(offsets, ids, weights, st):  # pragma: no cover - compiled
    """The infinite cache's hit tokens from dense ids in first-seen order, resumable (st = [seen, hit]): a
    block was seen before iff its id is below the distinct count before its request; a request hits its
    leading run of those."""
    seen = st[0]
    hit = st[1]
    for r in range(len(offsets) - 1):
        new = seen
        missed = False
        for p in range(offsets[r], offsets[r + 1]):
            if ids[p] >= seen:
                missed = True
                new = max(new, np.int64(ids[p]) + 1)
            elif not missed:
                hit += weights[p]
        seen = new
    st[0] = seen
    st[1] = hit


# ---------------------------------------------------------------- the pass


@njit(cache=True)
def _renumber_hot(tree_h, last_h, lastg_h, relab, st):  # pragma: no cover - compiled
    """Hot tree full: the hot blocks' times become 1..m in their order (prefix counts), relab[t-1] the
    global count G of the block now at time t; nothing recorded elsewhere changes."""
    m = 0
    for k in range(len(last_h)):
        if last_h[k] > 0:
            last_h[k] = _pref(tree_h, last_h[k])
            relab[last_h[k] - 1] = lastg_h[k]
            m += 1
    _ones(tree_h, m)
    st[1] = m
    st[3] = st[2]
    st[4] = m


@njit(cache=True, inline="always")
def _hot_clock(g, st, relab):  # pragma: no cover - compiled
    """The hot tree's time of global hot count g (what a sampled block recorded)."""
    if g >= st[3]:
        return st[4] + (g - st[3])
    lo, hi = 0, st[4]  # hot blocks whose last use is at or before g: a binary search over relab[:base]
    while lo < hi:
        mid = (lo + hi) // 2
        if relab[mid] <= g:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _renumber_salt(s, trees, sst, s_keys, s_last, h_sclk, last_h):  # pragma: no cover - compiled
    """Salt s's tree full: its blocks' own times and the hot blocks' clocks of it become prefix counts."""
    for q in range(s_keys.shape[1]):
        if s_keys[s, q] != EMPTY:
            s_last[s, q] = _pref2(trees, s, s_last[s, q])
    for k in range(len(last_h)):
        if last_h[k] > 0:
            h_sclk[k, s] = _pref2(trees, s, h_sclk[k, s])
    _ones(trees[s], sst[s, 0])
    sst[s, 1] = sst[s, 0]


@njit(cache=True, inline="always")
def _codes(ids, a, b, ht_keys, ht_val, salts, threshold, code):  # pragma: no cover - compiled
    """Per listed block of one request: its hot index (>= 0), or -1 - (mask of the salts keeping it)."""
    for p in range(a, b):
        k = _hot_index(ht_keys, ht_val, np.int64(ids[p]))
        code[p - a] = k if k >= 0 else -1 - _kept_mask(ids[p], salts, threshold)


@njit(cache=True, inline="always")
def _distances(a, b, code, ids, wts, u, inv_rate, st, relab, tree_h, last_h, h_sclk, trees, sst, s_keys, s_last,
               s_g, memo, hist_hot, hist_smp, width):  # pragma: no cover - compiled
    """Histogram one request's kept references before its accesses: per salt, by (floor(d) + u) // width."""
    n_salts = trees.shape[0]
    tmask = s_keys.shape[1] - 1
    top = hist_hot.shape[1] - 1
    marked_h = st[0]
    for s in range(n_salts):
        memo[s, 0] = -1  # the salt clock last queried, its count; memo[s, 2..3]: pending bin and weight
        memo[s, 2] = -1
    prev_t, dh = -1, 0
    for p in range(a, b):
        c = code[p - a]
        if c >= 0:
            t = last_h[c]
            if t == 0:
                continue
            if t == prev_t - 1:  # the previous block's time is just above: one mark more above this one
                dh += 1
            else:
                dh = marked_h - _pref(tree_h, t)
            prev_t = t
            for s in range(n_salts):
                if h_sclk[c, s] != memo[s, 0]:  # hot blocks used together share this: one query per run
                    memo[s, 0] = h_sclk[c, s]
                    memo[s, 1] = sst[s, 0] - _pref2(trees, s, h_sclk[c, s])
                at = min((int(np.floor(dh + inv_rate * memo[s, 1] + 1e-9)) + u) // width, top)
                if at != memo[s, 2]:  # whole token counts: added in any order, the sums are the same
                    if memo[s, 2] >= 0:
                        hist_hot[s, memo[s, 2]] += memo[s, 3]
                    memo[s, 2] = at
                    memo[s, 3] = 0
                memo[s, 3] += wts[p]
            continue
        if c == -1:  # kept by no salt: most references
            continue
        mask = -1 - c
        for s in range(n_salts):
            if not mask >> s & 1:
                continue
            q = _slot2(s_keys, s, ids[p], tmask)
            if s_keys[s, q] == EMPTY:
                continue
            d = (marked_h - _pref(tree_h, _hot_clock(s_g[s, q], st, relab))) + inv_rate * (
                sst[s, 0] - _pref2(trees, s, s_last[s, q]))
            hist_smp[s, min((int(np.floor(d + 1e-9)) + u) // width, top)] += wts[p] * inv_rate
    for s in range(n_salts):
        if memo[s, 2] >= 0:
            hist_hot[s, memo[s, 2]] += memo[s, 3]


@njit(cache=True, inline="always")
def _touch(a, b, code, ids, st, relab, tree_h, last_h, lastg_h, h_sclk, trees, sst, s_keys, s_last,
           s_g):  # pragma: no cover - compiled
    """One request's accesses, tail first (the head most recent, as vLLM frees blocks in reverse)."""
    n_salts = trees.shape[0]
    tmask = s_keys.shape[1] - 1
    hot_slots = len(tree_h) - 1
    salt_slots = trees.shape[1] - 1
    for p in range(b - 1, a - 1, -1):
        c = code[p - a]
        if c >= 0:
            if st[1] == hot_slots:
                _renumber_hot(tree_h, last_h, lastg_h, relab, st)
            if last_h[c] == 0:
                st[0] += 1
            else:
                _add(tree_h, last_h[c], -1)
            st[1] += 1
            st[2] += 1
            _add(tree_h, st[1], 1)
            last_h[c] = st[1]
            lastg_h[c] = st[2]
            for s in range(n_salts):
                h_sclk[c, s] = sst[s, 1]
            continue
        if c == -1:  # kept by no salt: most references
            continue
        mask = -1 - c
        for s in range(n_salts):
            if not mask >> s & 1:
                continue
            if sst[s, 1] == salt_slots:
                _renumber_salt(s, trees, sst, s_keys, s_last, h_sclk, last_h)
            q = _slot2(s_keys, s, ids[p], tmask)
            if s_keys[s, q] == EMPTY:
                s_keys[s, q] = ids[p]
                sst[s, 0] += 1
            else:
                _add2(trees, s, s_last[s, q], -1)
            sst[s, 1] += 1
            _add2(trees, s, sst[s, 1], 1)
            s_last[s, q] = sst[s, 1]
            s_g[s, q] = st[2]


@njit(cache=True, nogil=True)
def sampled_chunk(offsets, ids, wts, unl_prev, ht_keys, ht_val, salts, threshold, inv_rate, width, st, relab,
                  tree_h, last_h, lastg_h, h_sclk, trees, sst, s_keys, s_last, s_g, hist_hot,
                  hist_smp):  # pragma: no cover - compiled
    """One chunk of requests (local offsets) through the pass; the state arrays carry it to the next chunk.
    Fills hist_hot/hist_smp [salt, bin]: per request, distances before its own accesses."""
    longest = 1
    for r in range(len(offsets) - 1):
        longest = max(longest, offsets[r + 1] - offsets[r])
    code = np.empty(longest, np.int64)
    memo = np.empty((trees.shape[0], 4), np.int64)
    for r in range(len(offsets) - 1):
        a, b = offsets[r], offsets[r + 1]
        _codes(ids, a, b, ht_keys, ht_val, salts, threshold, code)
        _distances(a, b, code, ids, wts, unl_prev[r], inv_rate, st, relab, tree_h, last_h, h_sclk, trees, sst,
                   s_keys, s_last, s_g, memo, hist_hot, hist_smp, width)
        _touch(a, b, code, ids, st, relab, tree_h, last_h, lastg_h, h_sclk, trees, sst, s_keys, s_last, s_g)
