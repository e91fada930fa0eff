"""`analyze --reuse sql` against the scan on one log: wall time, peak RSS, and the same tables.

    .venv/bin/python bench/studies/reuse_sql_analyze.py LOG [--limits 1GB,128MB] [--work DIR] [--stream]

Runs `prefixscan analyze LOG -o RUN --no-findings` once with `--reuse scan` and once with `--reuse sql` at
each DuckDB memory limit, each in its own process (peak RSS is that process's ru_maxrss, from wait4),
in that order, then checks that every table of every SQL run has the scan run's bytes. Prints the load
average before and after, and each run's reuse timing from its summary. Never part of `make test`.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = str(Path(sys.executable).with_name("prefixscan"))


def run(log: str, out: Path, extra: list[str]) -> tuple[float, float, dict]:
    """(wall seconds, peak RSS MiB, summary) of one analyze in a child process."""
    cmd = [CLI, "analyze", log, "-o", str(out), "--force", "--no-findings", "-q", *extra]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed ({os.waitstatus_to_exitcode(status)}): {' '.join(cmd)}")
    summary = json.loads((out / "manifest.json").read_text())["analyze"]["summary"]
    return wall, usage.ru_maxrss / 1024, summary


def stages(summary: dict) -> str:
    """The process's peak RSS once each stage ended (the summary's timings), to show which stage sets it."""
    t = summary["timings"]
    return ", ".join(f"{k.removeprefix('peak_rss_mib_')} {t[k]:.0f}" for k in t if k.startswith("peak_rss_mib_"))


def same_tables(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("*.parquet"))
    return names == sorted(p.name for p in b.glob("*.parquet")) and all(
        filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--limits", default="1GB,128MB", help="DuckDB memory limits for --reuse sql")
    ap.add_argument("--work", default=None, help="where the runs and DuckDB's spill go")
    ap.add_argument("--stream", action="store_true", help="force streaming (--stream) in every run")
    args = ap.parse_args()
    common = ["--stream"] if args.stream else []
    print(f"{args.log} ({os.path.getsize(args.log) / 2**20:,.1f} MiB); load average before {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="reuse-sql-bench-", dir=args.work) as tmp:
        scan_dir = Path(tmp) / "scan"
        wall, rss, s = run(args.log, scan_dir, common)
        n = s["requests"]["accepted"]
        print(f"--reuse scan: {wall:7.1f} s wall, peak RSS {rss:7.0f} MiB ({n:,} requests)\n"
              f"    peak RSS (MiB) after each stage: {stages(s)}")
        for lim in args.limits.split(","):
            sql_dir = Path(tmp) / f"sql-{lim}"
            extra = [*common, "--reuse", "sql", "--reuse-memory-limit", lim, "--reuse-temp-dir", tmp]
            wall, rss, s = run(args.log, sql_dir, extra)
            same = same_tables(scan_dir, sql_dir)
            print(f"--reuse sql --reuse-memory-limit {lim}: {wall:7.1f} s wall, peak RSS {rss:7.0f} MiB, "
                  f"SQL {s['reuse']['sql_s']:.1f} s; tables identical to the scan's: {same}\n"
                  f"    peak RSS (MiB) after each stage: {stages(s)}")
            subprocess.run(["rm", "-rf", str(sql_dir)], check=False)
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
