"""Sampled capacity curves for logs too big for the exact pass (SHARDS, with the hottest blocks exact).

SHARDS (Waldspurger, Park, Garthwaite and Ahmad, "Efficient MRC Construction with SHARDS", FAST'15): keep a
block iff hash(block) mod P < T (rate R = T/P), a decision per *block*, so every reference of a kept block
is kept and its reuse distances survive; a distance counted among kept blocks, scaled by 1/R, estimates
the distance among all blocks. Sampling error concentrates in the head of the curve, where a few very hot
blocks (system prompts) carry much of the hit (Carra 2020), so the K most referenced blocks (exact counts
over the dense ids, one bincount) are kept too, at weight 1 while sampled blocks weigh 1/R; a distance is
the weighted count of distinct blocks used since.

What is estimated is the `lru_*` columns' quantity, vLLM's block pool of N blocks, through its exact
identity with the keyed LRU stack (`pool_fast`): a block hits iff its stack distance plus the previous
request's unlisted blocks is < N - 1. The identity needs a request's blocks in chained order (a block's own
distance then bounds those before it) and no request larger than the pool; below that size the estimate
is of the LRU stack, not the pool (docs/capacity.md has the measured difference). SHARDS-adj's idea (fix
the sampled total to the expected one) is applied as a ratio: the sampled part is scaled so that its
infinite-cache hit equals the exact one, when the caller knows it (`ideal`). The band is the least and
greatest estimate over `salts` independent re-salted samples; the estimate is their mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numba import njit

from prefixscan.reuse.capacity_sampled_kernel import splitmix64

P_BITS = 24
HOT_DEFAULT = 1024
SALTS_DEFAULT = 3


def check_rate(rate: float) -> float:
    """The sampling rate as a float in (0, 1], or a one-line ValueError."""
    try:
        r = float(rate)
    except (TypeError, ValueError):
        raise ValueError(f"the capacity sampling rate must be a number in (0, 1], got {rate!r}") from None
    if not 0.0 < r <= 1.0 or r * (1 << P_BITS) < 1:
        raise ValueError(f"the capacity sampling rate must be in (0, 1] and at least 2^-{P_BITS}, got {rate!r}")
    return r


def hot_blocks(ids: np.ndarray, n_distinct: int, k: int) -> np.ndarray:
    """Whether each dense block id is one of the k most referenced (exact counts; ties to the lower id;
    blocks referenced once are never hot). A bool array over the n_distinct ids."""
    hot = np.zeros(n_distinct, np.bool_)
    if k <= 0 or n_distinct == 0:
        return hot
    counts = np.bincount(ids, minlength=n_distinct)
    k = min(k, n_distinct)
    cut = np.argpartition(-counts, k - 1)[:k] if k < n_distinct else np.arange(n_distinct)
    kth = counts[cut].min()  # ties at the k-th count go to the lower ids, so the set is deterministic
    top = np.concatenate([np.flatnonzero(counts > kth), np.flatnonzero(counts == kth)])[:k]
    hot[top[counts[top] >= 2]] = True
    return hot


@njit(cache=True, inline="always")
def _kept(blk, is_hot, salt, threshold):  # pragma: no cover - compiled
    return is_hot[blk] or (splitmix64(np.uint64(blk) ^ salt) & np.uint64((1 << 24) - 1)) < threshold


@njit(cache=True)
def _kept_distinct(n, is_hot, salt, threshold):  # pragma: no cover - compiled
    """(kept blocks, of which not hot): what sizes the tree and the histogram exactly."""
    kept = 0
    cold = 0
    for blk in range(n):
        if _kept(blk, is_hot, salt, threshold):
            kept += 1
            cold += not is_hot[blk]
    return kept, cold


@dataclass(frozen=True)
class SampledCurve:
    """Estimated hit tokens of vLLM's block pool at every size, one cumulative curve per salt."""

    rate: float
    salts: int
    hot: int  # blocks tracked exactly
    kept_blocks: int  # distinct blocks kept, mean over salts
    total_references: int
    cums: tuple[np.ndarray, ...]  # cums[s][c] = estimated hit of the pool of c x width + 1 blocks
    width: int = 1  # blocks per histogram bin (1 at rate 1; about 1/(10 R) below, far under the error)

    def at(self, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(estimate, low, high) hit tokens at each pool size in blocks (block 0 is the null block)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        runs = np.vstack([c[np.clip((sizes - 1) // self.width, 0, len(c) - 1)] * (sizes >= 1) for c in self.cums])
        return runs.mean(axis=0), runs.min(axis=0), runs.max(axis=0)

    def smallest(self, target: float) -> int | None:
        """The smallest pool size whose estimated hit reaches `target` tokens, or None."""
        runs = [int(np.searchsorted(c, target - 1e-9 * max(1.0, target), side="left")) for c in self.cums]
        lo, hi = min(runs), max(max(runs), 1)
        while lo < hi:  # the mean of non-decreasing curves is non-decreasing: bisect between the salts' own
            mid = (lo + hi) // 2
            if np.mean([c[min(mid, len(c) - 1)] for c in self.cums]) >= target - 1e-9 * max(1.0, target):
                hi = mid
            else:
                lo = mid + 1
        return lo * self.width + 1 if lo < max(len(c) for c in self.cums) else None


def _histograms(offsets: np.ndarray, ids: np.ndarray, weights: np.ndarray, unl_prev: np.ndarray,
                is_hot: np.ndarray, rate: float, salts: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(hot, sampled) histograms [salt, bin] of one shared pass (`capacity_sampled_kernel`), the bin
    width, and the mean number of blocks kept per salt."""
    from prefixscan.reuse.capacity_sampled_kernel import sampled_pass

    threshold = np.uint64(int(rate * (1 << P_BITS)))
    cold = max(_kept_distinct(len(is_hot), is_hot, s, threshold)[1] for s in salts) if len(salts) else 0
    n_hot = int(is_hot.sum())
    hot_idx = np.full(len(is_hot), -1, np.int64)
    hot_idx[is_hot] = np.arange(n_hot)
    width = max(1, int(round(0.1 / rate)))
    bins = int((n_hot + cold / rate + unl_prev.max(initial=0)) // width) + 2
    table = 1 << max(int(2 * cold + 2).bit_length(), 4)
    hist_hot = np.zeros((len(salts), bins))
    hist_smp = np.zeros((len(salts), bins))
    sampled_pass(offsets, ids, weights, hot_idx, 1.0 / rate, threshold, salts, unl_prev, width,
                 max(64 * n_hot, 1 << 12), max(2 * cold, 1 << 12), table, hist_hot, hist_smp)
    kept = int(np.mean([_kept_distinct(len(is_hot), is_hot, s, threshold)[0] for s in salts]))
    return hist_hot, hist_smp, width, kept


def sampled_pool_curve(offsets: np.ndarray, ids: np.ndarray, n_distinct: int, weights: np.ndarray,
                       unlisted: np.ndarray, rate: float, hot: int = HOT_DEFAULT, salts: int = SALTS_DEFAULT,
                       seed: int = 0, ideal: int | None = None) -> SampledCurve:
    """Estimate the pool's hit at every size from a rate-`rate` sample of blocks plus the `hot` hottest.

    `ids`: dense block ids (int32, below n_distinct; `prefixscan.dense.dense_ids`); `weights`: the tokens
    each listed block adds to its request's hit (`capacity.block_weights`); `unlisted`: per request, the
    blocks it occupies beyond its listing (`pool_fast.request_shape`); `ideal`: the exact infinite-cache
    hit, if known. Memory: 13 bytes per distinct block and the kept blocks' tree; nothing per reference.
    Rate 1 keeps everything and is the exact curve."""
    rate = check_rate(rate)
    if salts < 1 or hot < 0:
        raise ValueError(f"salts must be >= 1 and hot >= 0, got salts={salts}, hot={hot}")
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    weights = np.ascontiguousarray(weights, dtype=np.int64)
    unl = np.asarray(unlisted, dtype=np.int64)
    unl_prev = np.concatenate([np.zeros(1, np.int64), unl[:-1]]) if len(unl) else unl
    is_hot = hot_blocks(ids, n_distinct, hot) if rate < 1.0 else np.zeros(n_distinct, np.bool_)
    salts = 1 if rate == 1.0 else salts
    salt_keys = np.array([_mix_py(seed * 1_000_003 + s) for s in range(salts)], np.uint64)
    hist_hot, hist_smp, width, kept = _histograms(offsets, ids, weights, unl_prev, is_hot, rate, salt_keys)
    cums = []
    for s in range(salts):
        smp = hist_smp[s]
        if ideal is not None and rate < 1.0:  # SHARDS-adj as a ratio: the sampled part's ideal hit made exact
            got, want = float(smp.sum()), float(ideal) - float(hist_hot[s].sum())
            if got > 0 and want > 0:
                smp = smp * (want / got)
        cum = np.zeros(hist_hot.shape[1] + 1)
        np.cumsum(hist_hot[s] + smp, out=cum[1:])
        cums.append(cum)
    return SampledCurve(rate, salts, int(is_hot.sum()), kept, len(ids), tuple(cums), width)


def _mix_py(x: int) -> int:
    return int(splitmix64(np.uint64(x & (2**64 - 1))))


# ---------------------------------------------------------------- the capacity table, sampled

AUTO_SAMPLE_BLOCKS = 500_000_000  # listed blocks above which analyze samples by default
AUTO_RATE = 0.01


def auto_rate(requested: float | None, listed_blocks: int) -> float | None:
    """The rate analyze uses: the requested one (1 = exact), else AUTO_RATE above AUTO_SAMPLE_BLOCKS."""
    if requested is not None:
        r = check_rate(requested)
        return None if r == 1.0 else r
    return AUTO_RATE if listed_blocks > AUTO_SAMPLE_BLOCKS else None


@njit(cache=True)
def _ideal_from_dense(offsets, ids, weights):  # pragma: no cover - compiled
    """The infinite cache's hit tokens from dense ids in first-seen order: a block was seen before iff its
    id is below the distinct count before its request; a request hits its leading run of those."""
    seen = 0
    hit = 0
    for r in range(len(offsets) - 1):
        new = seen
        missed = False
        for p in range(offsets[r], offsets[r + 1]):
            if ids[p] >= seen:
                missed = True
                new = max(new, ids[p] + 1)
            elif not missed:
                hit += weights[p]
        seen = new
    return hit


def sampled_capacity_curve(offsets: np.ndarray, ids: np.ndarray, n_distinct: int, prompt_tokens: np.ndarray,
                           block_size: int, rule: str, rate: float,
                           capacities_tokens: Sequence[int] | None = None, salts: int = SALTS_DEFAULT,
                           hot: int = HOT_DEFAULT, seed: int = 0, weights: np.ndarray | None = None) -> pa.Table:
    """`capacity.capacity_curve`'s table with the `lru_*` columns estimated from a rate-`rate` sample
    (`sampled_pool_curve`) and their band, OPT null; `ids`: dense block ids in first-seen order (as
    `prefixscan.dense.dense_ids` gives), so the ideal hit stays exact."""
    from prefixscan.reuse.capacity import Sampling, block_weights, curve_table, resolve_capacities
    from prefixscan.reuse.pool import hit_target
    from prefixscan.reuse.pool_fast import request_shape

    rate = check_rate(rate)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    prompts = np.ascontiguousarray(prompt_tokens, dtype=np.int64)
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    weights = block_weights(offsets, prompts, block_size, rule) if weights is None else weights
    _, unl = request_shape(offsets, prompts, block_size, rule)
    ideal = int(_ideal_from_dense(offsets, ids, weights))
    cap_tok, cap_blk = resolve_capacities(capacities_tokens, n_distinct, block_size)
    sc = sampled_pool_curve(offsets, ids, n_distinct, weights, unl, rate, hot, salts, seed, ideal)
    est, low, high = (np.rint(x).astype(np.int64) for x in sc.at(cap_blk))
    total = int(prompts.sum())
    targets = {}
    for f in (0.5, 0.9):
        n = sc.smallest(hit_target(f, ideal)) if ideal > 0 else None
        targets[f"lru_tokens_for_{int(f * 100)}pct_of_ideal"] = n * block_size if n is not None else None
    band = float(np.mean(high - low)) / total * 100 if total and len(est) else 0.0
    meta = {"rate": rate, "salts": sc.salts, "hot_blocks": sc.hot, "kept_blocks": sc.kept_blocks,
            "distinct_blocks": int(n_distinct),
            "total_references": sc.total_references, "band_mean_points": round(band, 4),
            "method": "SHARDS (hash-sampled blocks, distances scaled by 1/rate) with the hottest blocks exact; "
                      "estimate = mean over salts, band = min..max; OPT not computed"}
    return curve_table(cap_tok, cap_blk, est, ideal, total, None, targets, Sampling(rate, low, high, meta))
