"""Row 5: `simulate` throughput, each policy, on the 1M-request hashed trace, 16 replicas (target >= 50k req/s).

Requests per second = requests replayed / seconds, per policy. Two figures: the replay alone as
`prefixscan.sim.simulate` times it (`timings_s`, workload already built, kernels warm; bench/sim_throughput.py),
and the whole CLI (`prefixscan simulate RUN --policies all`: start-up, loading the run, building the workload
once, every policy, summaries) as requests x policies / wall seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

from common import PS, PY, ROOT, RowResult, fmt_s, median, rel, run

REPLICAS = 16


def simulate_row(res: RowResult, run_dir: Path, repeats: int, target: float, lg: Path, cli: bool = True,
                 limit: int = 0) -> RowResult:
    if not (run_dir / "requests.parquet").exists():
        res.verdict = f"not run: {rel(run_dir)} missing (its analyze row did not run)"
        return res
    help_r = run([PS, "simulate", "--help"], check=False, log=lg)
    if help_r.rc != 0:
        res.verdict = "not run: `prefixscan simulate` is not available"
        return res
    hcmd = [PY, str(ROOT / "bench/sim_throughput.py"), rel(run_dir), "--replicas", str(REPLICAS)]
    if limit:
        hcmd += ["--limit", str(limit)]
        res.details.append(f"replayed the first {limit:,} requests of the run only (time budget of this session: "
                           "the replay rate, not the count, is the measured quantity)")
    res.cmd(hcmd)
    runs = []
    for _ in range(repeats):
        r = run(hcmd, check=False, log=lg)
        if r.rc != 0:
            res.verdict = "failed"
            res.details.append(f"sim_throughput exited {r.rc}: `{r.stderr.strip()[-600:]}`")
            return res
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    n = runs[0]["requests"]
    names = list(runs[0]["policies"])
    per = {p: median([x["policies"][p]["replay_s"] for x in runs]) for p in names}
    per_call = {p: median([x["policies"][p]["call_s"] for x in runs]) for p in names}
    rps = {p: n / s for p, s in per.items()}
    ccmd = [PS, "simulate", rel(run_dir), "--replicas", str(REPLICAS), "--policies", "all", "--no-decision-log",
            "--no-save", "--json", "-q"]
    c = None
    if cli:
        res.cmd(ccmd)
        c = run(ccmd, check=False, log=lg)
    cli_rps = n * len(names) / c.seconds if c is not None and c.rc == 0 else None
    worst = min(rps, key=rps.get)
    below = [p for p in names if rps[p] < target]
    res.measured = (f"{n:,} req, {REPLICAS} replicas: replay {min(rps.values()):,.0f}-{max(rps.values()):,.0f} req/s "
                    f"(slowest {worst})" + (f"; CLI all policies {cli_rps:,.0f} req/s" if cli_rps else ""))
    res.ratio = f"slowest {rps[worst] / target:.2f}x of target"
    res.verdict = "met" if not below else f"gap: {len(below)}/{len(names)} policies below {target:,.0f} req/s"
    res.details += [
        f"run directory: `{rel(run_dir)}` ({n:,} requests, block size {runs[0]['block_size']}, "
        f"KV blocks per replica {runs[0].get('kv_blocks_per_replica')}: the default for llama-3.1-8b on h100)",
        "",
        "| policy | replay s (median) | replay req/s | simulate() call s | hit rate (token-weighted) | target |",
        "|---|---:|---:|---:|---:|---|",
        *[f"| {p} | {per[p]:.2f} | {rps[p]:,.0f} | {per_call[p]:.2f} | {runs[-1]['policies'][p]['hit_rate']:.4f} | "
          f"{'met' if rps[p] >= target else 'gap'} |" for p in names],
        "",
        (f"CLI `simulate --policies all` wall: {fmt_s(c.seconds)} (rc={c.rc}) for {len(names)} policies"
         if c is not None else "CLI run skipped at this scale (it replays every policy again; time budget)"),
    ]
    res.data = {"requests": n, "replay_s": per, "call_s": per_call, "rps": rps,
                "cli_s": c.seconds if c is not None else None}
    return res


def run_row(scale: str, repeats: int, lg: Path) -> RowResult:
    from common import OUT
    from row3_aiperf import TRACE_N, trace_run_dir

    n = TRACE_N[scale]
    # Row 3's run directory, or any other analyze run of the same trace (rows 4 and 7 make them too).
    cands = [trace_run_dir(scale), OUT / f"run-trace-cap-{scale}", OUT / f"run-mem-trace-{n}"]
    run_dir = next((d for d in cands if (d / "requests.parquet").exists()), cands[0])
    res = RowResult(5, f"`simulate`, each policy, {TRACE_N[scale]:,}-request hashed trace, {REPLICAS} replicas",
                    "requests per second", ">= 50k requests/s per policy")
    return simulate_row(res, run_dir, repeats, 50_000, lg, cli=True)
