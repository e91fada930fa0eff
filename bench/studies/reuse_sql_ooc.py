"""Row 9b (issue 18): the reuse SQL out of core, against the pipeline's own columns.

    .venv/bin/python bench/studies/reuse_sql_ooc.py TRACE.jsonl [--limits 64MB,2GB] [--work DIR]

Analyzes the log locally (no findings), then recomputes every request's ideal-cache columns with
`prefixscan.reuse.sql` on one DuckDB thread at each memory limit (spilling to --work), and
prints the time, the rate in block references a second and whether every column equals the pipeline's.
Never part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow.parquet as pq

from prefixscan.config import AnalyzeConfig
from prefixscan.pipeline.run import run_analysis
from prefixscan.reuse.sql import reuse_of_requests

COLUMNS = ("cached_blocks", "cached_tokens", "divergence_token", "tenant_cached_tokens", "conversation_cached_tokens")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--limits", default="64MB,2GB")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="row9b-", dir=args.work) as tmp:
        run = Path(tmp) / "run"
        run_analysis(AnalyzeConfig(inputs=(args.log,), output=str(run), findings=False))
        m = json.loads((run / "manifest.json").read_text())
        B, rule = m["config"]["block_size"], m["config"]["hit_rule"]
        req = pq.read_table(run / "requests.parquet")
        refs = int(req.column("block_hashes").combine_chunks().value_lengths().to_numpy().sum())
        print(f"{args.log}: {req.num_rows:,} requests, {refs:,} block references; load {os.getloadavg()}")
        for lim in args.limits.split(","):
            t = time.perf_counter()
            got = reuse_of_requests(str(run / "requests.parquet"), B, rule, memory_limit=lim, threads=1,
                                    temp_directory=tmp)
            dt = time.perf_counter() - t
            same = all(got.column(c).to_pylist() == req.column(c).to_pylist() for c in COLUMNS)
            print(f"memory_limit {lim}, 1 thread: {dt:.1f} s, {refs / dt / 1e6:.2f} M refs/s, equal: {same}")


if __name__ == "__main__":
    main()
