"""Slow, obviously correct references for `capacity_sampled` (tests only): the hot set from exact counts of
every block, and the sampled histograms from the definition, one salt at a time, with no trees, no shared
clocks and no renumbering: a kept reference's distance is counted over the kept blocks' last-use times."""

from __future__ import annotations

import math

import numpy as np

_M64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """splitmix64 in Python integers (the compiled one must agree)."""
    z = x & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def hot_blocks(ids: np.ndarray, n_distinct: int, k: int) -> np.ndarray:
    """The k most referenced blocks of the whole log by exact counts (ties to the lower id; a block
    referenced once is never hot), hottest first."""
    counts = np.bincount(np.asarray(ids, np.int64), minlength=n_distinct)
    order = np.lexsort((np.arange(n_distinct), -counts))[:max(k, 0)]
    return order[counts[order] >= 2].astype(np.int64)


def kept(blk: int, key: int, threshold: int) -> bool:
    """Whether the sample of salt `key` keeps block `blk` (hash mod 2^24 below the threshold)."""
    return (splitmix64(blk ^ key) & ((1 << 24) - 1)) < threshold


def histograms(offsets: np.ndarray, ids: np.ndarray, weights: np.ndarray, unl_prev: np.ndarray,
               hot_ids: np.ndarray, rate: float, keys: np.ndarray, width: int,
               bins: int) -> tuple[np.ndarray, np.ndarray]:
    """(hot, sampled) histograms [salt, bin]: per request in order, every kept reference whose block was used
    before adds its weight (hot) or weight / rate (sampled) at bin (floor(d) + unl_prev) // width, where d
    counts the distinct kept blocks used since that block's last use, hot ones as 1 and sampled ones as
    1 / rate; then the request's blocks are used tail first."""
    hot = {int(b) for b in hot_ids}
    inv = 1.0 / rate
    threshold = int(rate * (1 << 24))
    hh, hs = np.zeros((len(keys), bins)), np.zeros((len(keys), bins))
    for s, key in enumerate(int(k) for k in keys):
        last: dict[int, int] = {}
        clock = 0
        for r in range(len(offsets) - 1):
            a, b = int(offsets[r]), int(offsets[r + 1])
            for p in range(a, b):
                blk = int(ids[p])
                if blk not in last or not (blk in hot or kept(blk, key, threshold)):
                    continue
                since = [x for x, t in last.items() if t > last[blk]]
                n_hot = sum(x in hot for x in since)
                d = n_hot + inv * (len(since) - n_hot)
                at = min((math.floor(d + 1e-9) + int(unl_prev[r])) // width, bins - 1)
                if blk in hot:
                    hh[s, at] += weights[p]
                else:
                    hs[s, at] += weights[p] * inv
            for p in range(b - 1, a - 1, -1):
                blk = int(ids[p])
                if blk in hot or kept(blk, key, threshold):
                    clock += 1
                    last[blk] = clock
    return hh, hs
