"""Sampled capacity curves for logs too big for the exact pass (SHARDS, with the hottest blocks exact).

SHARDS (Waldspurger, Park, Garthwaite and Ahmad, "Efficient MRC Construction with SHARDS", FAST'15): keep a
block iff hash(block) mod P < T (rate R = T/P), a decision per *block*, so every reference of a kept block
is kept and its reuse distances survive; a distance counted among kept blocks, scaled by 1/R, estimates
the distance among all blocks. Sampling error concentrates in the head of the curve, where a few very hot
blocks (system prompts) carry much of the hit (Carra 2020), so the K most referenced blocks, found in one
streaming pass with a Misra-Gries counter of K slots (Misra and Gries, "Finding repeated elements", 1982),
are kept too, at weight 1 while sampled blocks weigh 1/R; a distance is the weighted count of distinct
blocks used since.

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

from prefixscan.reuse.fenwick import _renumber

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


@njit(cache=True, inline="always")
def _mix(x):  # pragma: no cover - compiled
    """splitmix64: a sampling key independent of how the keys were made (uint64 in, uint64 out)."""
    z = x
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def _slot(table, used, key, mask):  # pragma: no cover - compiled
    i = np.int64(_mix(key) & np.uint64(mask))
    while used[i] and table[i] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _misra_gries(keys, k):  # pragma: no cover - compiled
    """(keys, counts) of at most k counters: every key referenced more than len/(k+1) times is among them."""
    size = 1
    while size < 2 * k + 2:
        size *= 2
    mask = size - 1
    table = np.zeros(size, np.uint64)
    count = np.zeros(size, np.int64)
    used = np.zeros(size, np.bool_)
    held = 0
    for x in keys:
        i = _slot(table, used, x, mask)
        if used[i]:
            count[i] += 1
        elif held < k:
            used[i] = True
            table[i] = x
            count[i] = 1
            held += 1
        else:  # decrement every counter; rebuild the table without the ones that reach zero
            nt = np.zeros(size, np.uint64)
            nc = np.zeros(size, np.int64)
            nu = np.zeros(size, np.bool_)
            held = 0
            for j in range(size):
                if used[j] and count[j] > 1:
                    s = _slot(nt, nu, table[j], mask)
                    nu[s] = True
                    nt[s] = table[j]
                    nc[s] = count[j] - 1
                    held += 1
            table, count, used = nt, nc, nu
    return table[used], count[used]


@njit(cache=True)
def _exact_counts(keys, cand):  # pragma: no cover - compiled
    """How often each candidate key is referenced (a second pass over the keys, with a small set)."""
    size = 1
    while size < 2 * len(cand) + 2:
        size *= 2
    mask = size - 1
    table = np.zeros(size, np.uint64)
    used = np.zeros(size, np.bool_)
    count = np.zeros(size, np.int64)
    for x in cand:
        i = _slot(table, used, x, mask)
        used[i] = True
        table[i] = x
    for x in keys:
        i = _slot(table, used, x, mask)
        if used[i]:
            count[i] += 1
    out = np.zeros(len(cand), np.int64)
    for j in range(len(cand)):
        out[j] = count[_slot(table, used, cand[j], mask)]
    return out


def hot_keys(keys: np.ndarray, k: int) -> np.ndarray:
    """The k most referenced keys (uint64, sorted; fewer if fewer are referenced twice): candidates from one
    Misra-Gries pass with 4k counters (every key above 1/(4k+1) of the references is one), then their
    exact counts from a second pass, the top k of those."""
    if k <= 0 or len(keys) == 0:
        return np.zeros(0, np.uint64)
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    cand, _ = _misra_gries(keys, 4 * int(k))
    counts = _exact_counts(keys, cand)
    order = np.lexsort((cand, -counts))[:k]  # most referenced first; ties by key, so deterministic
    return np.sort(cand[order][counts[order] >= 2])


@njit(cache=True)
def _hot_flags(keys, hot_sorted):  # pragma: no cover - compiled
    """Per reference, whether its block is one of the hot ones (an open-addressed set, built once)."""
    size = 1
    while size < 2 * len(hot_sorted) + 2:
        size *= 2
    mask = size - 1
    table = np.zeros(size, np.uint64)
    used = np.zeros(size, np.bool_)
    for x in hot_sorted:
        i = _slot(table, used, x, mask)
        used[i] = True
        table[i] = x
    out = np.zeros(len(keys), np.bool_)
    if len(hot_sorted) == 0:
        return out
    for p in range(len(keys)):
        out[p] = used[_slot(table, used, keys[p], mask)]
    return out


@njit(cache=True)
def _select(offsets, keys, is_hot, threshold, salt):  # pragma: no cover - compiled
    """(indices of the kept references, sampled or hot; their requests' CSR offsets)."""
    out = np.empty(len(keys), np.int64)
    sub = np.zeros(len(offsets), np.int64)
    m = 0
    mask = np.uint64((1 << 24) - 1)
    for r in range(len(offsets) - 1):
        for p in range(offsets[r], offsets[r + 1]):
            if is_hot[p] or (_mix(keys[p] ^ salt) & mask) < threshold:
                out[m] = p
                m += 1
        sub[r + 1] = m
    return out[:m], sub


@njit(cache=True)
def _weighted_lru(offsets, ids, wts, scale, unl_prev, n_blocks, hist_hot, hist_smp):  # pragma: no cover - compiled
    """Histograms over floor(weighted distance + the previous request's unlisted blocks) (`pool_fast`) of
    the kept references' scaled token weights, hot and sampled apart (requests in order; distances before
    the request's own accesses, then its blocks touched tail first). First uses are not counted (they miss
    at every size). A float Fenwick tree over virtual times, renumbered (`fenwick._renumber` on a parallel
    0/1 tree) when full."""
    size = max(2 * n_blocks, 1 << 12)
    tree = np.zeros(size + 1, np.float64)
    marks = np.zeros(size + 1, np.int32)
    last = np.zeros(n_blocks, np.int32)
    weight_at = np.zeros(size + 1, np.float64)
    total = 0.0
    clock = 0
    for r in range(len(offsets) - 1):
        a, b = offsets[r], offsets[r + 1]
        for p in range(a, b):
            t = last[ids[p]]
            if t > 0:
                s = 0.0
                i = t
                while i > 0:
                    s += tree[i]
                    i -= i & -i
                e = min(int(np.floor(total - s + 1e-9)) + unl_prev[r], len(hist_hot) - 1)
                w = scale[ids[p]]
                if w == 1.0:
                    hist_hot[e] += wts[p]
                else:
                    hist_smp[e] += wts[p] * w
        for p in range(b - 1, a - 1, -1):
            if clock == size:
                clock = _renumber(marks, last)
                weight_at[:] = 0.0
                for blk in range(n_blocks):  # the weighted tree over the renumbered times, built in O(size)
                    if last[blk] > 0:
                        weight_at[last[blk]] = scale[blk]
                tree[:] = weight_at
                for i in range(1, size + 1):
                    j = i + (i & -i)
                    if j <= size:
                        tree[j] += tree[i]
            blk = ids[p]
            w = scale[blk]
            t = last[blk]
            if t == 0:
                total += w
            else:
                i = t
                while i <= size:
                    tree[i] -= w
                    marks[i] -= 1
                    i += i & -i
            clock += 1
            i = clock
            while i <= size:
                tree[i] += w
                marks[i] += 1
                i += i & -i
            last[blk] = clock


@dataclass(frozen=True)
class SampledCurve:
    """Estimated hit tokens of vLLM's block pool at every size, one cumulative curve per salt."""

    rate: float
    salts: int
    hot: int  # blocks tracked exactly
    kept_references: int  # mean over salts
    total_references: int
    cums: tuple[np.ndarray, ...]  # cums[s][c] = estimated hit of the pool of c + 1 blocks (last: beyond)

    def at(self, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(estimate, low, high) hit tokens at each pool size in blocks (block 0 is the null block)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        runs = np.vstack([c[np.clip(sizes - 1, 0, len(c) - 1)] * (sizes >= 1) for c in self.cums])
        return runs.mean(axis=0), runs.min(axis=0), runs.max(axis=0)

    def smallest(self, target: float) -> int | None:
        """The smallest pool size whose estimated hit reaches `target` tokens, or None."""
        width = max(len(c) for c in self.cums)
        mean = np.mean([np.pad(c, (0, width - len(c)), mode="edge") for c in self.cums], axis=0)
        i = int(np.searchsorted(mean, target - 1e-9 * max(1.0, target), side="left"))
        return i + 1 if i < len(mean) else None


def _one_salt(offsets: np.ndarray, keys: np.ndarray, weights: np.ndarray, unl_prev: np.ndarray,
              is_hot: np.ndarray, rate: float, salt: int, ideal: int | None) -> tuple[np.ndarray, int]:
    from prefixscan.dense import dense_ids

    idx, sub = _select(offsets, keys, is_hot, np.uint64(int(rate * (1 << P_BITS))), np.uint64(salt))
    ids, n = dense_ids(np.ascontiguousarray(keys[idx]))
    scale = np.full(n, 1.0 / rate)
    scale[ids[is_hot[idx]]] = 1.0
    bins = int(scale.sum()) + int(unl_prev.max(initial=0)) + 2  # every distance is below the kept weight
    hist_hot = np.zeros(bins)
    hist_smp = np.zeros(bins)
    _weighted_lru(sub, ids, weights[idx].astype(np.float64), scale, unl_prev, n, hist_hot, hist_smp)
    if ideal is not None:  # SHARDS-adj as a ratio: the sampled part's infinite-cache hit is made exact
        got, want = float(hist_smp.sum()), float(ideal) - float(hist_hot.sum())
        if got > 0 and want > 0:
            hist_smp *= want / got
    cum = np.zeros(bins + 1)
    np.cumsum(hist_hot + hist_smp, out=cum[1:])
    return cum, len(idx)


def sampled_pool_curve(offsets: np.ndarray, keys: np.ndarray, weights: np.ndarray, unlisted: np.ndarray,
                       rate: float, hot: int = HOT_DEFAULT, salts: int = SALTS_DEFAULT, seed: int = 0,
                       ideal: int | None = None) -> SampledCurve:
    """Estimate the pool's hit at every size from a rate-`rate` sample of blocks plus the `hot` hottest.

    `keys`: one uint64 per listed block (its hash, or any fixed id per block); `weights`: the tokens each
    adds to its request's hit (`capacity.block_weights`); `unlisted`: per request, the blocks it occupies
    beyond its listing (`pool_fast.request_shape`); `ideal`: the exact infinite-cache hit, if known.
    Rate 1 keeps everything and is the exact curve."""
    rate = check_rate(rate)
    if salts < 1 or hot < 0:
        raise ValueError(f"salts must be >= 1 and hot >= 0, got salts={salts}, hot={hot}")
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    weights = np.asarray(weights)
    unl = np.asarray(unlisted, dtype=np.int64)
    unl_prev = np.concatenate([[0], unl[:-1]]) if len(unl) else unl
    hot_set = hot_keys(keys, hot) if rate < 1.0 else np.zeros(0, np.uint64)
    is_hot = _hot_flags(keys, hot_set)
    salts = 1 if rate == 1.0 else salts
    cums, kept = [], 0
    for s in range(salts):
        salt = int(_mix_py(seed * 1_000_003 + s))
        cum, k = _one_salt(offsets, keys, weights, unl_prev, is_hot, rate, salt, ideal if rate < 1 else None)
        cums.append(cum)
        kept += k
    return SampledCurve(rate, salts, len(hot_set), kept // salts, len(keys), tuple(cums))


def _mix_py(x: int) -> int:
    return int(_mix(np.uint64(x & (2**64 - 1))))


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
                           hot: int = HOT_DEFAULT, seed: int = 0) -> pa.Table:
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
    weights = block_weights(offsets, prompts, block_size, rule)
    _, unl = request_shape(offsets, prompts, block_size, rule)
    ideal = int(_ideal_from_dense(offsets, ids, weights))
    cap_tok, cap_blk = resolve_capacities(capacities_tokens, n_distinct, block_size)
    sc = sampled_pool_curve(offsets, ids.astype(np.uint64), weights, unl, rate, hot, salts, seed, ideal)
    est, low, high = (np.rint(x).astype(np.int64) for x in sc.at(cap_blk))
    total = int(prompts.sum())
    targets = {}
    for f in (0.5, 0.9):
        n = sc.smallest(hit_target(f, ideal)) if ideal > 0 else None
        targets[f"lru_tokens_for_{int(f * 100)}pct_of_ideal"] = n * block_size if n is not None else None
    band = float(np.mean(high - low)) / total * 100 if total and len(est) else 0.0
    meta = {"rate": rate, "salts": sc.salts, "hot_blocks": sc.hot, "kept_references": sc.kept_references,
            "total_references": sc.total_references, "band_mean_points": round(band, 4),
            "method": "SHARDS (hash-sampled blocks, distances scaled by 1/rate) with the hottest blocks exact; "
                      "estimate = mean over salts, band = min..max; OPT not computed"}
    return curve_table(cap_tok, cap_blk, est, ideal, total, None, targets, Sampling(rate, low, high, meta))
