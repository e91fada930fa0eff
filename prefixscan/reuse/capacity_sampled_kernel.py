"""The compiled pass of `capacity_sampled`: every salt at once, the hot blocks' part shared between them.

A kept reference's weighted distance splits in two: the distinct *hot* blocks used since its block's last
use (weight 1, the same for every salt) plus 1/R times the distinct *sampled* blocks used since (its own
salt's sample). So one small Fenwick tree over the hot blocks' accesses serves all salts, and each salt
has a tree over its own sampled accesses only (about R of all references). A block records, at its last
use, its time on its own tree and the other trees' clocks then; the blocks used since on a tree are that
tree's marked count minus its prefix count at the recorded clock. A tree whose clock reaches its end is
renumbered: every recorded clock is replaced by its prefix count (the order is kept, gaps close), and
the tree rebuilt as the marks 1..marked.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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


@njit(cache=True)
def _ones(tree, m):  # pragma: no cover - compiled
    tree[0] = 0
    for i in range(1, len(tree)):
        tree[i] = max(0, min(i, m) - (i - (i & -i)))


@njit(cache=True, inline="always")
def splitmix64(x):  # pragma: no cover - compiled
    """splitmix64: a sampling key independent of how the keys were made (uint64 in, uint64 out)."""
    z = x
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def _slot(keys, blk, mask):  # pragma: no cover - compiled
    """Open-addressed slot of block `blk` in one salt's table (-1 = empty)."""
    i = np.int64(splitmix64(np.uint64(blk)) & np.uint64(mask))
    while keys[i] != -1 and keys[i] != blk:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _renumber_hot(tree_h, marked_h, last_h, s_hclk, s_keys):  # pragma: no cover - compiled
    """Hot tree full: every clock recorded on it (hot blocks' own times, sampled blocks' hot clocks) becomes
    its prefix count; returns the new clock (= marked)."""
    for k in range(len(last_h)):
        if last_h[k] > 0:
            last_h[k] = _pref(tree_h, last_h[k])
    for s in range(s_keys.shape[0]):
        for q in range(s_keys.shape[1]):
            if s_keys[s, q] != -1:
                s_hclk[s, q] = _pref(tree_h, s_hclk[s, q])
    _ones(tree_h, marked_h)
    return marked_h


@njit(cache=True)
def _renumber_salt(s, trees, marked, s_keys, s_last, h_sclk, last_h):  # pragma: no cover - compiled
    """Salt s's tree full: its blocks' own times and the hot blocks' clocks of it become prefix counts."""
    tree = trees[s]
    for q in range(s_keys.shape[1]):
        if s_keys[s, q] != -1:
            s_last[s, q] = _pref(tree, s_last[s, q])
    for k in range(len(last_h)):
        if last_h[k] > 0:
            h_sclk[s, k] = _pref(tree, h_sclk[s, k])
    _ones(tree, marked[s])
    return marked[s]


@njit(cache=True)
def _distances(offsets, ids, wts, hot_idx, inv_rate, threshold, salts, unl_prev, width, r, tree_h, marked_h, last_h,
               h_sclk, trees, marked, s_keys, s_last, s_hclk, hist_hot, hist_smp):  # pragma: no cover - compiled
    """Histogram request r's kept references (before its accesses): per salt, by (floor(distance) + unlisted)
    // width."""
    mask = np.uint64((1 << 24) - 1)
    tmask = s_keys.shape[1] - 1
    top = hist_hot.shape[1] - 1
    u = unl_prev[r]
    for p in range(offsets[r], offsets[r + 1]):
        blk = ids[p]
        k = hot_idx[blk]
        if k >= 0:
            if last_h[k] == 0:
                continue
            dh = marked_h - _pref(tree_h, last_h[k]) - 0.0
            for s in range(len(salts)):
                d = dh + inv_rate * (marked[s] - _pref(trees[s], h_sclk[s, k]))
                hist_hot[s, min((int(np.floor(d + 1e-9)) + u) // width, top)] += wts[p]
            continue
        for s in range(len(salts)):
            if (splitmix64(np.uint64(blk) ^ salts[s]) & mask) >= threshold:
                continue
            q = _slot(s_keys[s], blk, tmask)
            if s_keys[s, q] == -1:
                continue
            d = (marked_h - _pref(tree_h, s_hclk[s, q])) + inv_rate * (marked[s] - _pref(trees[s], s_last[s, q]))
            hist_smp[s, min((int(np.floor(d + 1e-9)) + u) // width, top)] += wts[p] * inv_rate


@njit(cache=True)
def sampled_pass(offsets, ids, wts, hot_idx, inv_rate, threshold, salts, unl_prev, width, hot_slots, salt_slots,
                 table_size, hist_hot, hist_smp):  # pragma: no cover - compiled
    """The whole pass; fills hist_hot/hist_smp [salt, bin]. Requests in order: distances before the
    request's own accesses, then its blocks touched tail first (head most recent), as the exact curve."""
    n_hot = 0
    for b in range(len(hot_idx)):
        n_hot = max(n_hot, hot_idx[b] + 1)
    n_salts = len(salts)
    mask = np.uint64((1 << 24) - 1)
    tmask = table_size - 1
    tree_h = np.zeros(hot_slots + 1, np.int64)
    last_h = np.zeros(max(n_hot, 1), np.int64)
    h_sclk = np.zeros((n_salts, max(n_hot, 1)), np.int64)
    trees = np.zeros((n_salts, salt_slots + 1), np.int64)
    marked = np.zeros(n_salts, np.int64)
    clock = np.zeros(n_salts, np.int64)
    s_keys = np.full((n_salts, table_size), -1, np.int64)
    s_last = np.zeros((n_salts, table_size), np.int64)
    s_hclk = np.zeros((n_salts, table_size), np.int64)
    marked_h = 0
    clock_h = 0
    for r in range(len(offsets) - 1):
        _distances(offsets, ids, wts, hot_idx, inv_rate, threshold, salts, unl_prev, width, r, tree_h, marked_h, last_h,
                   h_sclk, trees, marked, s_keys, s_last, s_hclk, hist_hot, hist_smp)
        for p in range(offsets[r + 1] - 1, offsets[r] - 1, -1):
            blk = ids[p]
            k = hot_idx[blk]
            if k >= 0:
                if clock_h == hot_slots:
                    clock_h = _renumber_hot(tree_h, marked_h, last_h, s_hclk, s_keys)
                if last_h[k] == 0:
                    marked_h += 1
                else:
                    _add(tree_h, last_h[k], -1)
                clock_h += 1
                _add(tree_h, clock_h, 1)
                last_h[k] = clock_h
                for s in range(n_salts):
                    h_sclk[s, k] = clock[s]
                continue
            for s in range(n_salts):
                if (splitmix64(np.uint64(blk) ^ salts[s]) & mask) >= threshold:
                    continue
                if clock[s] == salt_slots:
                    clock[s] = _renumber_salt(s, trees, marked, s_keys, s_last, h_sclk, last_h)
                q = _slot(s_keys[s], blk, tmask)
                if s_keys[s, q] == -1:
                    s_keys[s, q] = blk
                    marked[s] += 1
                else:
                    _add(trees[s], s_last[s, q], -1)
                clock[s] += 1
                _add(trees[s], clock[s], 1)
                s_last[s, q] = clock[s]
                s_hclk[s, q] = clock_h
