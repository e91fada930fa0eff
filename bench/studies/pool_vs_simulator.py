"""The capacity curve's pool (`reuse/pool.py`) against the simulator's pool (`sim/kvcache.py`) over the same
pool sizes, in one run: equal hit tokens at every size, and the CPU ratio (interleaved, best of `--repeat`).

Issue 29 asked to keep one block pool in the product if the simulator's could serve the capacity curve. It
gives the same values (and tests/test_pool.py holds both to `tests/oracles/pool_ref.py`), but costs more:
its pool carries what a simulation needs and the curve does not (per-slot release times and eviction-age
histograms, a replica axis, a transposed residency matrix). Measured on the 2-CPU shared machine, load ~9
(`.venv/bin/python bench/studies/pool_vs_simulator.py RUN/requests.parquet:B:RULE ... --repeat 5`,
runs of `analyze` on the sample logs and `../shared/data/mooncake`), 16 log-spaced sizes:

| log | requests | distinct blocks | pool.py CPU s | simulator's pool CPU s | ratio |
|---|---:|---:|---:|---:|---:|
| conversation_trace.jsonl (B=512, trace) | 12,031 | 182,790 | 0.293 | 0.516 | 1.76x |
| mooncake_small.jsonl (B=512, trace) | 2,000 | 6,010 | 0.011 | 0.022 | 1.92x |
| chat.jsonl (B=16, vllm) | 400 | 6,291 | 0.011 | 0.018 | 1.57x |

So both stay: `pool.py` for the curve, `kvcache.py` for the simulator.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prefixscan.encode.dense import dense_ids
from prefixscan.reuse.hitrule import cap_blocks, cap_tokens
from prefixscan.reuse.pool import _pool_one, longest_request
from prefixscan.sim import kvcache as K


@njit(cache=True)
def sim_pool_one(offsets, ids, prompts, B, trace, n_distinct, N, longest):
    """Hit tokens of the simulator's pool of N blocks (one replica), requests one at a time, prefill only,
    truncated as `sim.outcome.request_budget` truncates an oversized request."""
    n = max(N, 1)
    res = np.zeros((max(n_distinct, 1), 1), np.int8).T
    kf = np.zeros((1, max(n_distinct, 1), 2), np.int32)
    sl = np.zeros((1, n, 6), np.int32)
    slf = sl.view(np.float32)
    meta = np.zeros((1, 5), np.int64)
    meta[:, K.CAP] = n - 1
    ev, age = np.zeros(1, np.int64), np.zeros(1, np.float64)
    hist = np.zeros((1, K.N_AGE_BUCKETS), np.int64)
    scratch = np.zeros(max(n_distinct, n) + 8, np.int32)
    table = np.zeros(longest + 1, np.int32)
    usable = n - 1
    hit_tok = 0
    for r in range(len(offsets) - 1):
        a = offsets[r]
        nb = offsets[r + 1] - a
        p = prompts[r]
        total = max(nb, (p + B - 1) // B) if p > 0 else nb
        pin = min(nb, usable)
        extra = min(total - nb, usable - pin)
        mh = min(pin, cap_blocks(p, B, trace))
        if usable <= 0:
            continue
        k, ne = K.admit(res, kf, sl, slf, meta, ev, age, hist, scratch, 0, ids[a:a + pin], mh, pin + extra,
                        0.0, table[:pin + extra])
        if k > 0:
            hit_tok += min(k * B, cap_tokens(p, B, trace))
        K.release(sl, slf, meta, 0, table[:pin + extra], 0.0)
    return hit_tok


def load(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(offsets, dense int32 ids, prompt tokens, distinct ids) of a run's requests table."""
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["block_hashes", "prompt_tokens"])
    lists = t["block_hashes"].combine_chunks()
    off = lists.offsets.to_numpy().astype(np.int64)
    flat = lists.values.to_numpy()[off[0]:off[-1]]
    ids, nd = dense_ids(np.ascontiguousarray(flat, np.uint64))
    return off - off[0], ids.astype(np.int32), t["prompt_tokens"].to_numpy().astype(np.int64), nd


def measure(path: str, block_size: int, trace: bool, repeat: int) -> None:
    off, ids, prompts, nd = load(path)
    sizes = np.unique(np.geomspace(max(2, nd // 1000), nd + 2, 16).astype(np.int64))
    longest = longest_request(off, prompts, block_size)
    args = (off, ids, prompts, block_size, trace, nd)
    a = [_pool_one(*args, int(c), longest)[0] for c in sizes]  # also compiles both
    b = [sim_pool_one(*args, int(c), longest) for c in sizes]
    ta, tb = [], []
    for _ in range(repeat):
        t0 = time.process_time()
        for c in sizes:
            _pool_one(*args, int(c), longest)
        ta.append(time.process_time() - t0)
        t0 = time.process_time()
        for c in sizes:
            sim_pool_one(*args, int(c), longest)
        tb.append(time.process_time() - t0)
    print(f"{path}: requests {len(prompts)} blocks {len(ids)} distinct {nd} sizes {len(sizes)}: equal={a == b} "
          f"pool.py {min(ta):.3f}s simulator's pool {min(tb):.3f}s ratio {min(tb) / min(ta):.2f}x "
          f"(best of {repeat}, CPU s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", help="RUN/requests.parquet:BLOCK_SIZE:RULE (vllm or trace)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    for spec in args.tables:
        path, bs, rule = spec.rsplit(":", 2)
        measure(path, int(bs), rule == "trace", args.repeat)


if __name__ == "__main__":
    main()
