"""Sampled LRU capacity curves for logs too big for the exact pass (SHARDS, with the hottest blocks exact).

SHARDS (Waldspurger, Park, Garthwaite and Ahmad, "Efficient MRC Construction with SHARDS", FAST'15): keep
a block reference iff hash(block) mod P < T, a rate R = T/P chosen per *block*, so every reference of a
kept block is kept and its reuse distances survive; a distance measured among sampled blocks, divided
by R, estimates the distance among all blocks. Sampling error concentrates in the head of the curve,
where a few very hot blocks (system prompts) carry much of the hit (Carra 2020), so the K hottest blocks
are tracked exactly: every reference of theirs is kept with weight 1 while sampled blocks weigh 1/R, and a
distance is the weighted count of distinct blocks used more recently. The hottest blocks are found in a
bounded pre-pass over a 10x denser sample of references.

Order and hit rule are those of the exact curve (`capacity._lru_chunk`): a request's distances are taken
before its own accesses, and its blocks are then touched tail first, so its head is most recent (vLLM
frees a finished request's blocks in reverse order). That keeps the per-block LRU prefix-closed, so a
block's own distance decides its hit (REFERENCE.md 14). The error band comes from re-salting the sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

P_BITS = 24
HOT_DEFAULT = 4096


def _mix(hashes: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64 of hash ^ salt: a sampling key independent of how the hashes were made."""
    with np.errstate(over="ignore"):
        z = hashes.astype(np.uint64) ^ np.uint64(salt & (2**64 - 1))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def sample_mask(hashes: np.ndarray, rate: float, salt: int) -> np.ndarray:
    """Which references are kept: hash mod 2^24 < rate x 2^24 (a decision per block, not per reference)."""
    threshold = np.uint64(int(rate * (1 << P_BITS)))
    return (_mix(hashes, salt) & np.uint64((1 << P_BITS) - 1)) < threshold


def hot_blocks(hashes: np.ndarray, rate: float, k: int, salt: int) -> np.ndarray:
    """The k most referenced blocks, counted over a sample of *references* 10x denser than the curve's rate
    (a block referenced often is seen often; bounded memory), among those seen at least twice."""
    if k <= 0:
        return np.zeros(0, np.uint64)
    positions = np.arange(len(hashes), dtype=np.uint64)
    dense = hashes[sample_mask(positions, min(1.0, 10 * rate), salt ^ 0x5A5A5A5A)]
    uniq, counts = np.unique(dense, return_counts=True)
    keep = counts >= 2
    uniq, counts = uniq[keep], counts[keep]
    order = np.argsort(-counts, kind="stable")[:k]
    return np.sort(uniq[order])


@njit(cache=True)
def _weighted_lru(offsets, ids, weights, scale, n_blocks, hist_dist, hist_w):  # pragma: no cover - compiled
    """Per reference (request order, distances before the request's accesses, then tail-first touches):
    the weighted distance among more recent distinct blocks and the reference's scaled token weight.
    Returns how many references had a finite distance (the rest were first uses)."""
    n_ref = len(ids)
    size = n_ref + 1
    tree = np.zeros(size + 1, np.float64)
    last = np.zeros(n_blocks, np.int64)
    total = 0.0
    clock = 0
    out = 0
    for r in range(len(offsets) - 1):
        a, b = offsets[r], offsets[r + 1]
        for p in range(a, b):
            t = last[ids[p]]
            if t == 0:
                continue
            s = 0.0
            i = t
            while i > 0:
                s += tree[i]
                i -= i & -i
            hist_dist[out] = total - s  # weight of blocks touched after block ids[p]
            hist_w[out] = weights[p] * scale[ids[p]]
            out += 1
        for p in range(b - 1, a - 1, -1):
            blk = ids[p]
            w = scale[blk]
            t = last[blk]
            if t == 0:
                total += w
            else:
                i = t
                while i <= size:
                    tree[i] -= w
                    i += i & -i
            clock += 1
            i = clock
            while i <= size:
                tree[i] += w
                i += i & -i
            last[blk] = clock
    return out


@dataclass(frozen=True)
class SampledCurve:
    """Estimated LRU hit tokens at each capacity (blocks), with the band over re-salted samples."""

    capacities_blocks: np.ndarray
    hit_tokens: np.ndarray  # the first salt's estimate
    low: np.ndarray
    high: np.ndarray
    rate: float
    hot: int
    salts: int
    sampled_references: int
    total_references: int


def _one(offsets: np.ndarray, hashes: np.ndarray, weights: np.ndarray, caps: np.ndarray, rate: float,
         hot: np.ndarray, salt: int) -> tuple[np.ndarray, int]:
    is_hot = np.isin(hashes, hot) if len(hot) else np.zeros(len(hashes), bool)
    keep = sample_mask(hashes, rate, salt) | is_hot
    idx = np.nonzero(keep)[0]
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))[idx]
    sub_off = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=len(offsets) - 1))]).astype(np.int64)
    uniq, dense = np.unique(hashes[idx], return_inverse=True)
    scale = np.where(np.isin(uniq, hot), 1.0, 1.0 / rate) if len(hot) else np.full(len(uniq), 1.0 / rate)
    dist = np.zeros(len(idx), np.float64)
    wts = np.zeros(len(idx), np.float64)
    n = _weighted_lru(sub_off, dense.astype(np.int64), weights[idx].astype(np.float64), scale, len(uniq), dist, wts)
    order = np.argsort(dist[:n], kind="stable")
    cum = np.concatenate([[0.0], np.cumsum(wts[:n][order])])
    # a reference hits at capacity c iff fewer than c (weighted) distinct blocks were used since: d < c
    pos = np.searchsorted(dist[:n][order], caps, side="left")
    return cum[pos], len(idx)


def sampled_lru_curve(offsets: np.ndarray, hashes: np.ndarray, weights: np.ndarray, capacities_blocks: np.ndarray,
                      rate: float, hot: int = HOT_DEFAULT, salts: int = 3, seed: int = 0) -> SampledCurve:
    """Estimate the LRU curve at the given capacities from a rate-`rate` sample of blocks (0 < rate <= 1).

    `weights` are the tokens each listed block adds to its request's hit (`capacity.block_weights`).
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"the sampling rate must be in (0, 1], got {rate}")
    caps = np.asarray(capacities_blocks, dtype=np.float64)
    hashes = np.asarray(hashes, dtype=np.uint64)
    hot_set = hot_blocks(hashes, rate, hot, seed) if rate < 1.0 else np.zeros(0, np.uint64)
    runs, kept = [], 0
    for s in range(max(salts, 1)):
        est, k = _one(np.asarray(offsets, np.int64), hashes, np.asarray(weights), caps, rate, hot_set,
                      seed * 1_000_003 + s)
        runs.append(est)
        kept = kept or k
    stack = np.vstack(runs)
    return SampledCurve(np.asarray(capacities_blocks), stack[0], stack.min(axis=0), stack.max(axis=0), rate,
                        len(hot_set), max(salts, 1), kept, len(hashes))
