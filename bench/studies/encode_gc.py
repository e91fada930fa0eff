"""The encode stage's CPU under the cyclic garbage collector's settings, as ratios in one run (issue 15).

    .venv/bin/python bench/studies/encode_gc.py LOG.jsonl [--limit 30000] [--repeats 3]

Each run is a fresh child process that reads the first `--limit` accepted records of LOG through the
pipeline's read stage (`Reader`, untimed), then times `RecordEncoder.encode` over them in the encode
pool's batches (CPU seconds of the process), under one setting: `default` (CPython's thresholds),
`fewer` (`memory.fewer_collections`, what analyze and its workers use) or `off` (no collection: the bound
nothing can beat). Settings alternate, `--repeats` times
each; medians are printed with every block hash's checksum, which must agree (the collector changes no
result, only time). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ("default", "fewer", "off")


def child(log: str, limit: int, setting: str) -> None:
    """Runs in a fresh process: read, encode under `setting`, print CPU seconds and a checksum."""
    import gc
    import time
    from contextlib import nullcontext

    import xxhash

    from prefixscan.config import AnalyzeConfig
    from prefixscan.encode.encoder import Hashed, RecordEncoder
    from prefixscan.memory import fewer_collections
    from prefixscan.pipeline.config import POOL_BATCH
    from prefixscan.pipeline.read import Reader
    from prefixscan.read.sources import expand

    cfg = AnalyzeConfig(inputs=(log,), workers=0)
    recs: list = []
    events = Reader(cfg, expand([log]), POOL_BATCH).events()  # the pipeline's own read stage
    for ev in events:
        if isinstance(ev, list):
            recs += ev
        if len(recs) >= limit:
            events.close()
            break
    recs = recs[:limit]
    enc = RecordEncoder(cfg, keep_tokens=False)
    enc.load()
    enc.set_threads(1)
    digest = xxhash.xxh3_64()
    if setting == "off":
        gc.disable()
    ctx = fewer_collections() if setting == "fewer" else nullcontext()
    with ctx:
        t = time.process_time()
        for i in range(0, len(recs), POOL_BATCH):
            for h in enc.encode(recs[i:i + POOL_BATCH]):
                digest.update(h.hashes.tobytes() if isinstance(h, Hashed) else b"rejected")
        cpu = time.process_time() - t
    print(json.dumps({"setting": setting, "cpu_s": cpu, "records": len(recs), "checksum": digest.hexdigest()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--limit", type=int, default=30_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=SETTINGS)
    args = ap.parse_args()
    if args.child:
        child(args.log, args.limit, args.child)
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for _ in range(args.repeats):
        for s in SETTINGS:
            out = subprocess.run([sys.executable, __file__, args.log, "--limit", str(args.limit), "--child", s],
                                 env=env, check=True, capture_output=True, text=True).stdout
            runs[s].append(json.loads(out.strip().splitlines()[-1]))
    med = {s: statistics.median(r["cpu_s"] for r in rs) for s, rs in runs.items()}
    sums = {r["checksum"] for rs in runs.values() for r in rs}
    every = {s: [round(r["cpu_s"], 2) for r in rs] for s, rs in runs.items()}
    print(json.dumps({"log": args.log, "records": runs["default"][0]["records"], "load": os.getloadavg(),
                      "cpu_s_median": med, "cpu_s_all": every,
                      "default_over_fewer": med["default"] / med["fewer"], "same_hashes": len(sums) == 1}))


if __name__ == "__main__":
    main()
