"""Row 4 helper: prefixscan's LRU and OPT hit rates at given capacities, measured like kvcache-simulator.

    .venv/bin/python bench/capacity_values.py RUN_DIR BLOCKS[,BLOCKS...] [--warmup 0.5]

kvcache-simulator measures token-weighted hits over the last half of the requests (the first half warms the
cache). Cache decisions do not depend on block weights, so zeroing the weights of the warm-up requests'
blocks makes prefixscan's kernels count exactly the measured window. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import pyarrow.parquet as pq

from prefixscan.reuse.capacity.lru import opt_hits, prepare
from prefixscan.reuse.pool_fast import lru_pool_curves


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("blocks")
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--block-size", type=int, default=512)
    args = ap.parse_args()
    caps = [int(x) for x in args.blocks.split(",") if x]
    t = pq.read_table(f"{args.run_dir}/requests.parquet", columns=["seq", "prompt_tokens", "block_hashes"])
    t = t.sort_by("seq")
    col = t["block_hashes"].combine_chunks()
    offsets = col.offsets.to_numpy().astype(np.int64)
    offsets = offsets - offsets[0]
    hashes = col.values.to_numpy()
    prompt = t["prompt_tokens"].to_numpy().astype(np.int64)
    t0 = time.perf_counter()
    prep = prepare(offsets, hashes, prompt, args.block_size, "trace")
    warm = math.floor(len(prompt) * args.warmup)
    weights = prep.weights.copy()
    weights[: offsets[warm]] = 0
    prep = prep._replace(weights=weights)
    measured_total = int(prompt[warm:].sum())
    lru_tok, _ = lru_pool_curves(prep.offsets, prep.ids, prep.weights, prep.n_distinct, prompt,
                                 args.block_size, "trace")
    t1 = time.perf_counter()
    opt_tok, _ = opt_hits(prep, caps)
    t2 = time.perf_counter()
    lru = [int(lru_tok[min(c, prep.n_distinct)]) for c in caps]
    print(json.dumps({
        "capacities_blocks": caps, "measured_tokens": measured_total, "warmup_requests": warm,
        "lru_hit_rate": [x / measured_total for x in lru], "opt_hit_rate": [int(x) / measured_total for x in opt_tok],
        "ideal_hit_rate": int(lru_tok[-1]) / measured_total, "n_distinct": int(prep.n_distinct),
        "lru_all_capacities_s": t1 - t0, "opt_s": t2 - t1,
    }))


if __name__ == "__main__":
    main()
