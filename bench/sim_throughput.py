"""Rows 5/6 helper: replay throughput of `prefixscan.sim.simulate` per policy on a run directory.

    .venv/bin/python bench/sim_throughput.py RUN_DIR [--replicas 16] [--policies all]

Loads the run's requests table once, warms up, then replays each policy and prints one JSON object:
per-policy replay seconds (what `timings_s` measures), requests, hit rates, which engine ran.

Warm-up, untimed: every policy on a 500-request slice (loads or compiles the numba kernels), then one
full-size replay of sglang_cache_aware, the replay with the largest memory (KV state plus the approximate
view, ~0.4 GB on the 10k-request chat run). Without it the first large replay of a fresh process also pays
the operating system's first touch of that memory (about 0.7 s on the 2-core VM), which is not replay work;
`--cold` skips it so that cost can be measured too.
"""

from __future__ import annotations

import argparse
import json
import time

from prefixscan.run.load import load_run
from prefixscan.sim import SimConfig, simulate
from prefixscan.sim.policies import POLICIES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--policies", default="all")
    ap.add_argument("--limit", type=int, default=0, help="replay only the first N requests")
    ap.add_argument("--cold", action="store_true", help="no full-size warm-up replay (see the docstring)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    run = load_run(args.run_dir)
    table = run.table("requests")
    if args.limit:
        table = table.slice(0, args.limit)
    mcfg = run.manifest.get("config", {})
    bs, rule = int(mcfg.get("block_size") or 16), str(mcfg.get("hit_rule") or "vllm")
    t_load = time.perf_counter() - t0
    names = list(POLICIES) if args.policies == "all" else args.policies.split(",")
    simulate(table.slice(0, 500), SimConfig(replicas=2, policies=tuple(names)), block_size=bs, hit_rule=rule)
    t_warm = time.perf_counter()
    if not args.cold:
        simulate(table, SimConfig(replicas=args.replicas, policies=("sglang_cache_aware",), decision_log=False),
                 block_size=bs, hit_rule=rule)
    out = {"requests": table.num_rows, "load_s": t_load, "block_size": bs, "policies": {},
           "warmup_replay_s": time.perf_counter() - t_warm if not args.cold else None}
    for name in names:
        t = time.perf_counter()
        res = simulate(table, SimConfig(replicas=args.replicas, policies=(name,), decision_log=False),
                       block_size=bs, hit_rule=rule)
        wall = time.perf_counter() - t
        s = res.policies[name]
        out["policies"][name] = {"replay_s": res.timings_s[name], "call_s": wall,
                                 "hit_rate": s["hit_rate_token_weighted"], "requests": s.get("requests_total"),
                                 "engine": res.engines.get(name)}
        out["kv_blocks_per_replica"] = res.info.get("kv_blocks_per_replica")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
