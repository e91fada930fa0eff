"""Time the capacity-curve kernels on a large synthetic trace (not part of the tests).

    .venv/bin/python bench/studies/bench_capacity.py [--requests 1000000] [--opt-points 6]

The trace mimics chat traffic: sessions grow turn by turn on top of Zipf-popular system prompts, and each
request ends in one block nobody else has (the new question / partial block), ~30 blocks per request.
Sessions live for a stretch of the trace, so reuse has locality like real traffic.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from prefixscan.reuse.capacity.lru import opt_hits, prepare
from prefixscan.reuse.capacity.table import default_capacities
from prefixscan.reuse.pool_fast import lru_pool_curves


def synthetic_trace(n_req: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, uint64 hashes, prompt tokens) of a chained-prefix chat workload, built with numpy only."""
    rng = np.random.default_rng(seed)
    n_sessions = max(1, n_req // 8)
    n_templates = 500
    tpl_len = rng.integers(4, 16, size=n_templates)
    template_of = np.minimum(rng.zipf(1.3, size=n_sessions) - 1, n_templates - 1)
    # Sessions are active for a while: request i talks to a session near position i in session order.
    drift = np.arange(n_req) * (n_sessions / n_req) + rng.normal(0.0, 300.0, size=n_req)
    session = np.clip(np.round(drift), 0, n_sessions - 1).astype(np.int64)
    order = np.argsort(session, kind="stable")  # turn = how many earlier requests the session made
    starts = np.r_[0, np.flatnonzero(np.diff(session[order])) + 1]
    run = np.repeat(starts, np.diff(np.r_[starts, n_req]))
    turn = np.empty(n_req, np.int64)
    turn[order] = np.arange(n_req) - run
    t = template_of[session]
    n_tpl = tpl_len[t]
    n_hist = np.minimum(3 * (turn + 1), 20 + rng.integers(0, 8, size=n_req))
    counts = n_tpl + n_hist + 1
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
    req = np.repeat(np.arange(n_req), counts)
    j = np.arange(offsets[-1]) - offsets[:-1][req]
    kind_tpl = j < n_tpl[req]
    kind_last = j == counts[req] - 1
    ids = np.where(kind_tpl, t[req] * 64 + j, (1 << 32) + session[req] * 64 + (j - n_tpl[req]))
    ids = np.where(kind_last, (1 << 48) + req, ids).astype(np.uint64)
    hashes = ids * np.uint64(0x9E3779B97F4A7C15)  # scramble, as real hashes would be
    prompts = counts * 512 - rng.integers(0, 512, size=n_req)
    return offsets, hashes, prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--opt-points", type=int, default=6)
    ap.add_argument("--rule", default="trace")
    args = ap.parse_args()

    tiny = synthetic_trace(200, seed=1)  # compile (or load cached) kernels outside the timings
    warm = prepare(*tiny, 512, args.rule)
    lru_pool_curves(warm.offsets, warm.ids, warm.weights, warm.n_distinct, tiny[2], 512, args.rule)
    opt_hits(warm, [4, 64])

    t0 = time.perf_counter()
    offsets, hashes, prompts = synthetic_trace(args.requests)
    t1 = time.perf_counter()
    prep = prepare(offsets, hashes, prompts, 512, args.rule)
    t2 = time.perf_counter()
    tok, _ = lru_pool_curves(prep.offsets, prep.ids, prep.weights, prep.n_distinct, prompts, 512, args.rule)
    t3 = time.perf_counter()
    grid = default_capacities(prep.n_distinct, 512)
    caps = [c // 512 for c in grid[:: max(1, len(grid) // args.opt_points)]][: args.opt_points]
    opt_tok, _ = opt_hits(prep, caps)
    t4 = time.perf_counter()

    n_blocks = len(prep.ids)
    total = prep.total_prompt_tokens
    print(f"requests {args.requests:,}  blocks {n_blocks:,}  distinct {prep.n_distinct:,}  "
          f"tokens {total:,}  ideal hit {tok[-1] / total:.4f}")
    print(f"generate            {t1 - t0:7.2f} s")
    print(f"prepare (remap ids) {t2 - t1:7.2f} s")
    rate = n_blocks / (t3 - t2) / 1e6
    print(f"LRU one pass        {t3 - t2:7.2f} s  ({rate:.1f} M blocks/s, all capacities)")
    print(f"OPT {len(caps)} capacities    {t4 - t3:7.2f} s  ({(t4 - t3) / len(caps):.2f} s per capacity, "
          f"threads share them)")
    for c, o in zip(caps, opt_tok, strict=True):
        lru = tok[min(c, prep.n_distinct)] / total
        print(f"  capacity {c:>10,} blocks  LRU {lru:.4f}  OPT {o / total:.4f}")


if __name__ == "__main__":
    main()
