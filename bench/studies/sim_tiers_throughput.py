"""Replay throughput of KV-tier and disaggregated simulations against the plain replay, on one run.

    .venv/bin/python bench/studies/sim_tiers_throughput.py RUN_DIR [--replicas 16] [--limit N] [--policies P,...]

Prints one JSON object: requests/s per case and policy (replay time only, `SimResult.timings_s`) and the
load average when it started. The plain case runs compiled; tiers and disaggregation run on the Python
reference engine (docs/simulator.md, "Speed"), so the plain reference is measured too.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from prefixscan.run.load import load_run
from prefixscan.sim import SimConfig, simulate


def cases(replicas: int) -> dict[str, dict[str, Any]]:
    return {
        "plain (compiled)": {},
        "plain (reference)": {"_engine": "reference"},
        "host tier": {"host_kv_gib": 256},
        "host + shared": {"host_kv_gib": 256, "shared_kv_gib": 8192},
        "host, router sees tiers": {"host_kv_gib": 256, "router_sees_tiers": True},
        "P/D (no co-located replay)": {"decode_replicas": max(replicas // 4, 1), "compare_colocated": False},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0, help="replay only the first N requests")
    ap.add_argument("--policies", default="round_robin,dynamo_kv,cost_based")
    args = ap.parse_args()
    run = load_run(args.run_dir)
    table = run.table("requests")
    if args.limit:
        table = table.slice(0, args.limit)
    mcfg = run.manifest.get("config", {})
    bs, rule = int(mcfg.get("block_size") or 16), str(mcfg.get("hit_rule") or "vllm")
    pols = tuple(args.policies.split(","))
    warm = SimConfig(replicas=args.replicas, policies=pols, host_kv_blocks=10)
    simulate(table.slice(0, 300), warm, block_size=bs, hit_rule=rule)  # load the compiled kernels
    simulate(table.slice(0, 300), SimConfig(replicas=args.replicas, policies=pols), block_size=bs, hit_rule=rule)
    out: dict[str, Any] = {"requests": table.num_rows, "replicas": args.replicas, "load_avg": os.getloadavg()[0]}
    out["requests_per_s"] = {}
    for name, kw in cases(args.replicas).items():
        kw = dict(kw)
        engine = kw.pop("_engine", None)
        cfg = SimConfig(replicas=args.replicas, policies=pols, decision_log=False, **kw)
        r = simulate(table, cfg, block_size=bs, hit_rule=rule, engine=engine)
        out["requests_per_s"][name] = {p: round(table.num_rows / r.timings_s[p]) for p in pols}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
