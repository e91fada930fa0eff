"""Sampled capacity curves for logs too big for the exact pass (SHARDS, with the hottest blocks exact).

SHARDS (Waldspurger, Park, Garthwaite and Ahmad, "Efficient MRC Construction with SHARDS", FAST'15): keep a
block iff hash(block) mod P < T (rate R = T/P), a decision per *block*, so every reference of a kept block
is kept and its reuse distances survive; a distance counted among kept blocks, scaled by 1/R, estimates
the distance among all blocks. Sampling error concentrates in the head of the curve, where a few very hot
blocks (system prompts) carry much of the hit (Carra 2020), so the K most referenced blocks (candidates
from a Misra-Gries pass, then their exact counts) are kept too, at weight 1 while sampled blocks weigh
1/R; a distance is the weighted count of distinct blocks used since. The log is read chunk by chunk, three
times (`curve_from_chunks`), so memory is the sample's state, not the log's.

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

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from prefixscan.reuse.capacity.sampled_kernel import (
    EMPTY,
    build_table,
    count_chunk,
    ideal_chunk,
    kept_distinct,
    mg_chunk,
    sampled_chunk,
    splitmix64,
)
from prefixscan.reuse.capacity.spill import plan_chunks
from prefixscan.reuse.capacity.table import (
    TARGET_FRACTIONS,
    TARGET_NAMES,
    Sampling,
    block_weights,
    curve_table,
    resolve_capacities,
)

P_BITS = 24
HOT_DEFAULT = 1024
SALTS_DEFAULT = 3


def check_rate(rate: float | str) -> float:
    """The sampling rate as a float in (0, 1], or a one-line ValueError."""
    try:
        r = float(rate)
    except (TypeError, ValueError):
        raise ValueError(f"the capacity sampling rate must be a number in (0, 1], got {rate!r}") from None
    if not 0.0 < r <= 1.0 or r * (1 << P_BITS) < 1:
        raise ValueError(f"the capacity sampling rate must be in (0, 1] and at least 2^-{P_BITS}, got {rate!r}")
    return r


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


# one chunk of the log: (local offsets int64, dense ids int32, block weights int64, unlisted blocks int64 per request)
Chunk = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
Chunks = Callable[[], Iterable[Chunk]]  # each call reads the log again from its start, chunk by chunk
CHUNK_BLOCKS = 1 << 21  # listed blocks per chunk of an in-memory log (its weights are made per chunk)
MG_PER_HOT = 16  # Misra-Gries counters per hot block sought
MAX_BINS = 1 << 18  # histogram bins per salt, at most about


def _pow2(n: int) -> int:
    return 1 << max(int(n).bit_length(), 4)


class FirstPass(NamedTuple):
    """What one read of the log gives before the sampled pass: hot candidates, the exact ideal hit, sizes."""

    candidates: np.ndarray  # int64 block ids, ascending: every block with more than refs/(k+1) references
    ideal: int
    most_unlisted: int
    references: int


def first_pass(chunks: Chunks, hot: int) -> FirstPass:
    """Misra-Gries (1982) with MG_PER_HOT x hot counters (a fixed-size table, not a count per distinct
    block), the infinite cache's hit (`ideal_chunk`) and the largest unlisted count, in one read."""
    k = max(MG_PER_HOT * hot, 1)
    keys, cnt = np.full(_pow2(2 * k), EMPTY, np.int64), np.zeros(_pow2(2 * k), np.int64)
    mg, ist = np.zeros(1, np.int64), np.zeros(2, np.int64)
    most, refs = 0, 0
    for offsets, ids, weights, unl in chunks():
        if hot > 0:
            mg_chunk(ids, keys, cnt, mg, k)
        ideal_chunk(offsets, ids, weights, ist)
        most = max(most, int(unl.max(initial=0)))
        refs += len(ids)
    return FirstPass(np.sort(keys[keys != EMPTY]), int(ist[1]), most, refs)


def hot_set(chunks: Chunks, candidates: np.ndarray, hot: int) -> np.ndarray:
    """The `hot` candidates with the most references (exact counts from one more read; ties to the lower
    id; a block referenced once is never hot), hottest first."""
    if hot <= 0 or len(candidates) == 0:
        return np.zeros(0, np.int64)
    keys, val = build_table(candidates, _pow2(2 * len(candidates)))
    cnt = np.zeros(len(keys), np.int64)
    for _, ids, _, _ in chunks():
        count_chunk(ids, keys, cnt)
    exact = np.zeros(len(candidates), np.int64)
    exact[val[val >= 0]] = cnt[val >= 0]
    order = np.lexsort((candidates, -exact))[:hot]
    return candidates[order][exact[order] >= 2]


def histograms(chunks: Chunks, n_distinct: int, hot_ids: np.ndarray, rate: float, keys: np.ndarray,
               most_unlisted: int, hot_slots: int | None = None,
               salt_slots: int | None = None) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(hot, sampled) histograms [salt, bin] of one shared pass (`sampled_kernel`), the bin width
    and the mean number of blocks kept per salt. State: the hot blocks' and the kept blocks' own. The trees'
    sizes (renumbered when full) can be given, for tests."""
    threshold = np.uint64(int(rate * (1 << P_BITS)))
    n_hot, n_salts = len(hot_ids), len(keys)
    ht_keys, ht_val = build_table(np.ascontiguousarray(hot_ids, np.int64), _pow2(4 * n_hot))
    cold = np.zeros(n_salts, np.int64)
    kept_distinct(n_distinct, ht_keys, ht_val, keys, threshold, cold)
    most_cold = int(cold.max(initial=0))
    # about 1/(10 R) blocks per bin, and at most ~2^18 bins: the histograms stay in cache (a hot reference
    # adds to one bin per salt); a bin is then 1/2^18 of the distinct blocks, far under the smallest grid size
    width = 1 if rate == 1.0 else max(1, int(round(0.1 / rate)), -(-n_distinct // MAX_BINS))
    bins = int((n_hot + most_cold / rate + most_unlisted) // width) + 2
    table = _pow2(2 * most_cold + 2)
    salt_slots = max(2 * most_cold, 1 << 12) if salt_slots is None else max(int(salt_slots), most_cold + 1)
    hist_hot, hist_smp = np.zeros((n_salts, bins)), np.zeros((n_salts, bins))
    st, relab = np.zeros(5, np.int64), np.zeros(max(n_hot, 1), np.int64)
    hot_slots = max(16 * n_hot, 1 << 10) if hot_slots is None else max(int(hot_slots), n_hot + 1)
    tree_h = np.zeros(hot_slots + 1, np.int64)
    last_h, lastg_h = np.zeros(max(n_hot, 1), np.int64), np.zeros(max(n_hot, 1), np.int64)
    h_sclk = np.zeros((max(n_hot, 1), n_salts), np.int64)  # per hot block, each salt's clock at its use
    trees, sst = np.zeros((n_salts, salt_slots + 1), np.int64), np.zeros((n_salts, 2), np.int64)
    s_keys = np.full((n_salts, table), EMPTY, np.int32)
    s_last, s_g = np.zeros((n_salts, table), np.int64), np.zeros((n_salts, table), np.int64)
    prev = 0  # the previous request's unlisted blocks, carried across chunks
    for offsets, ids, weights, unl in chunks():
        unl_prev = np.concatenate([[prev], unl[:-1]]).astype(np.int64) if len(unl) else unl
        prev = int(unl[-1]) if len(unl) else prev
        sampled_chunk(offsets, ids, weights, unl_prev, ht_keys, ht_val, keys, threshold, 1.0 / rate, width,
                      st, relab, tree_h, last_h, lastg_h, h_sclk, trees, sst, s_keys, s_last, s_g, hist_hot,
                      hist_smp)
    return hist_hot, hist_smp, width, n_hot + int(np.mean(cold))


def salt_keys(salts: int, seed: int) -> np.ndarray:
    """The salts' keys (uint64), one per re-salted sample."""
    return np.array([int(splitmix64(np.uint64((seed * 1_000_003 + s) & (2**64 - 1)))) for s in range(salts)],
                    np.uint64)


def curve_from_chunks(chunks: Chunks, n_distinct: int, rate: float, hot: int = HOT_DEFAULT,
                      salts: int = SALTS_DEFAULT, seed: int = 0, adjust: bool = True,
                      ideal: int | None = None) -> tuple[SampledCurve, int]:
    """(the sampled curve, the exact ideal hit) from three reads of the log, chunk by chunk: hot candidates
    and the ideal, the candidates' counts, the sampled pass. Memory: the hot blocks', the kept blocks' and the
    histograms' state, and one chunk; nothing per distinct block or per reference of the whole log.
    With `adjust`, the sampled part is scaled so that its infinite-cache hit is `ideal` (default: the exact
    one, from first-seen order)."""
    rate = check_rate(rate)
    if salts < 1 or salts > 32 or hot < 0:
        raise ValueError(f"salts must be in 1..32 and hot >= 0, got salts={salts}, hot={hot}")
    if rate == 1.0:
        hot, salts = 0, 1
    fp = first_pass(chunks, hot)
    hot_ids = hot_set(chunks, fp.candidates, hot)
    keys = salt_keys(salts, seed)
    hist_hot, hist_smp, width, kept = histograms(chunks, n_distinct, hot_ids, rate, keys, fp.most_unlisted)
    cums = []
    for s in range(salts):
        smp = hist_smp[s]
        if adjust and rate < 1.0:  # SHARDS-adj as a ratio: the sampled part's ideal hit made exact
            got = float(smp.sum())
            want = float(fp.ideal if ideal is None else ideal) - float(hist_hot[s].sum())
            if got > 0 and want > 0:
                smp = smp * (want / got)
        cum = np.zeros(hist_hot.shape[1] + 1)
        np.cumsum(hist_hot[s] + smp, out=cum[1:])
        cums.append(cum)
    return SampledCurve(rate, salts, len(hot_ids), kept, fp.references, tuple(cums), width), fp.ideal


def array_chunks(offsets: np.ndarray, ids: np.ndarray, weights: Callable[[np.ndarray, int, int], np.ndarray],
                 unlisted: Callable[[np.ndarray, int, int], np.ndarray],
                 chunk_blocks: int = CHUNK_BLOCKS) -> Chunks:
    """An in-memory log as chunks of whole requests (about chunk_blocks listed blocks each); `weights` and
    `unlisted` give a chunk's from (its local offsets, first request, end request)."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    runs = plan_chunks(np.diff(offsets), chunk_blocks)

    def gen() -> Iterator[Chunk]:
        for c in runs:
            local = offsets[c.r0:c.r1 + 1] - offsets[c.r0]
            yield local, ids[c.b0:c.b1], weights(local, c.r0, c.r1), unlisted(local, c.r0, c.r1)

    return gen


# ---------------------------------------------------------------- the capacity table, sampled

AUTO_SAMPLE_BLOCKS = 500_000_000  # listed blocks above which analyze samples by default
AUTO_RATE = 0.01


def auto_rate(requested: float | None, listed_blocks: int) -> float | None:
    """The rate analyze uses: the requested one (1 = exact), else AUTO_RATE above AUTO_SAMPLE_BLOCKS."""
    if requested is not None:
        r = check_rate(requested)
        return None if r == 1.0 else r
    return AUTO_RATE if listed_blocks > AUTO_SAMPLE_BLOCKS else None


def sampled_table(chunks: Chunks, n_distinct: int, total_tokens: int, block_size: int, rate: float,
                  capacities_tokens: Sequence[int] | None = None, salts: int = SALTS_DEFAULT,
                  hot: int = HOT_DEFAULT, seed: int = 0) -> pa.Table:
    """`lru.capacity_curve`'s table with the `lru_*` columns estimated (`curve_from_chunks`) and their
    band, OPT null; the chunks' ids are dense ids in first-seen order, so the ideal hit stays exact."""
    from prefixscan.reuse.pool import hit_target

    cap_tok, cap_blk = resolve_capacities(capacities_tokens, n_distinct, block_size)
    sc, ideal = curve_from_chunks(chunks, n_distinct, rate, hot, salts, seed)
    est, low, high = (np.rint(x).astype(np.int64) for x in sc.at(cap_blk))
    sizes = [sc.smallest(hit_target(f, ideal)) if ideal > 0 else None for f in TARGET_FRACTIONS]
    targets = {name: n * block_size if n is not None else None for name, n in zip(TARGET_NAMES, sizes, strict=True)}
    band = float(np.mean(high - low)) / total_tokens * 100 if total_tokens and len(est) else 0.0
    meta = {"rate": sc.rate, "salts": sc.salts, "hot_blocks": sc.hot, "kept_blocks": sc.kept_blocks,
            "distinct_blocks": int(n_distinct),
            "total_references": sc.total_references, "band_mean_points": round(band, 4),
            "method": "SHARDS (hash-sampled blocks, distances scaled by 1/rate) with the hottest blocks exact; "
                      "estimate = mean over salts, band = min..max; OPT not computed"}
    return curve_table(cap_tok, cap_blk, est, ideal, total_tokens, None, targets, Sampling(sc.rate, low, high, meta))


def sampled_capacity_curve(offsets: np.ndarray, ids: np.ndarray, n_distinct: int, prompt_tokens: np.ndarray,
                           block_size: int, rule: str, rate: float,
                           capacities_tokens: Sequence[int] | None = None, salts: int = SALTS_DEFAULT,
                           hot: int = HOT_DEFAULT, seed: int = 0) -> pa.Table:
    """`sampled_table` of an in-memory log; `ids`: dense block ids in first-seen order (as
    `prefixscan.encode.dense.dense_ids` gives). Weights are made chunk by chunk, not for the whole log."""
    from prefixscan.reuse.pool_fast import request_shape

    rate = check_rate(rate)
    prompts = np.ascontiguousarray(prompt_tokens, dtype=np.int64)
    chunks = array_chunks(offsets, ids, lambda off, r0, r1: block_weights(off, prompts[r0:r1], block_size, rule),
                          lambda off, r0, r1: request_shape(off, prompts[r0:r1], block_size, rule)[1])
    return sampled_table(chunks, n_distinct, int(prompts.sum()), block_size, rate, capacities_tokens, salts, hot,
                         seed)
