"""Replay throughput of `prefixscan simulate`, requests per second per policy, on a 100k-request trace.

Run: .venv/bin/python bench/studies/bench_simulate.py [--requests 100000] [--replicas 8] [--kv-blocks 20000]
Not part of the test suite. Kernels are compiled (or loaded from numba's cache) before timing. One
`simulate` call replays every policy, as `prefixscan simulate --policies all` does: the workload is
prepared once, then each policy's replay is timed on its own; metrics and tables are in the total.
"""

from __future__ import annotations

import argparse
import time

from prefixscan.sim import SimConfig, simulate
from prefixscan.sim.synthetic import conversations_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--kv-blocks", type=int, default=20_000)
    ap.add_argument("--rps", type=float, default=100.0)
    ap.add_argument("--policies", default="all")
    ap.add_argument("--knowledge", default="exact")
    args = ap.parse_args()
    t0 = time.perf_counter()
    table = conversations_table(
        args.requests // args.turns,
        args.turns,
        system_prompts=20,
        system_blocks=64,
        turn_blocks=(4, 40),
        rate_rps=args.rps,
        think_s=20.0,
        seed=0,
    )
    blocks = sum(len(x) for x in table["block_hashes"].to_pylist())
    print(
        f"trace: {table.num_rows:,} requests, {blocks:,} block references "
        f"({blocks / table.num_rows:.0f}/request), generated in {time.perf_counter() - t0:.1f} s"
    )
    simulate(table.slice(0, 500), SimConfig(replicas=2, kv_blocks=500, policies=("all",)))  # compile kernels
    cfg = SimConfig(
        replicas=args.replicas,
        kv_blocks=args.kv_blocks,
        policies=(args.policies,),
        knowledge=args.knowledge,
        event_delay_s=1.0 if args.knowledge == "delayed" else 0.0,
    )
    t = time.perf_counter()
    res = simulate(table, cfg)
    total = time.perf_counter() - t
    print(f"{args.replicas} replicas x {args.kv_blocks:,} KV blocks, knowledge {args.knowledge}")
    print(f"{'policy':20s} {'replay s':>9s} {'req/s':>9s} {'hit':>7s} {'ttft p95':>9s}")
    for name, s in res.policies.items():
        dt = res.timings_s[name]
        print(
            f"{name:20s} {dt:9.2f} {table.num_rows / dt:9,.0f} {s['hit_rate_token_weighted']:7.1%} "
            f"{s['ttft_p95_s']:9.3f}"
        )
    replay = sum(res.timings_s.values())
    print(
        f"whole run: {total:.1f} s for {len(res.policies)} policies "
        f"(replays {replay:.1f} s, workload + metrics + tables {total - replay:.1f} s)"
    )


if __name__ == "__main__":
    main()
