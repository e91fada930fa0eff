"""Start-up and fixed per-run costs: wall of `prefixscan --help`, `analyze --help`, `--version` and a
50-request `analyze`, for this checkout and a baseline commit, interleaved in one run (issue 15).

    .venv/bin/python bench/studies/startup.py [--baseline REF] [-n 7] [--log CHAT.jsonl] [--workers N]

The baseline's `prefixscan/` is extracted with `git archive REF` into --work (kept, so numba's on-disk
cache of its kernels survives between runs) and run with this venv's interpreter and packages through
PYTHONPATH, so only the package source differs. Each case runs once untimed per tree (numba compiles and
caches the kernels of a fresh tree; the OS caches the files), then `-n` times, alternating the trees;
the median wall is reported with the best and the ratio baseline/this, and the median CPU seconds of
the process and its encode workers (less sensitive to a busy machine than the wall). Without --log, a 50-request fresh
chat log is made with `prefixscan synth`. Prints a markdown table and the load average before and after:
on a busy machine the seconds inflate, the ratios much less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py

from common import revision_tree

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv" / "bin" / "python")


def extract(ref: str, work: Path) -> Path:
    """`prefixscan/` of commit `ref` under work/<sha>/ (once)."""
    sha = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    dest = work / sha[:12]
    if not (dest / "prefixscan" / "__init__.py").exists():
        revision_tree(sha, dest)
    return dest


def tiny_log(work: Path) -> Path:
    """A 50-request multi-turn chat log with fresh text (the issue's 12k log's kind, start-up dominated)."""
    log = work / "tiny-fresh.jsonl"
    if not log.exists():
        subprocess.run([PY, "-m", "prefixscan", "synth", "-o", str(log), "-n", "50", "--seed", "20261129", "-s",
                        "chat", "--no-truth", "--text", "fresh", "--prompt-tokens", "5600", "--tenants", "8",
                        "--breakers", "off"], cwd=ROOT, check=True, capture_output=True)
    return log


def cases(log: Path, out: Path, workers: int | None) -> dict[str, list[str]]:
    extra = [] if workers is None else ["--workers", str(workers)]
    return {
        "prefixscan --version": ["--version"],
        "prefixscan --help": ["--help"],
        "prefixscan analyze --help": ["analyze", "--help"],
        "analyze 50 requests -q": ["analyze", str(log), "-o", str(out), "--force", "-q", *extra],
    }


def once(src: Path, args: list[str], cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s of the process and the children it waited for, e.g. encode workers) of one run."""
    env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "100"}
    t = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([PY, "-m", "prefixscan", *args], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                             stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{src}: prefixscan {' '.join(args)} failed ({p.returncode}): {err.read()[-500:]!r}")
    return dt, ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="main", help="git ref to compare with (default: main)")
    ap.add_argument("-n", type=int, default=7, help="timed runs per case and tree (default 7)")
    ap.add_argument("--log", type=Path, help="the small log to analyze (default: a 50-request synth chat log)")
    ap.add_argument("--workers", type=int, help="pass --workers N to analyze (default: analyze's own default)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "prefixscan-startup-bench")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    trees = {"baseline " + a.baseline: extract(a.baseline, a.work), "this checkout": ROOT}
    log = a.log.resolve() if a.log else tiny_log(a.work)
    load0 = os.getloadavg()
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for case, args in cases(log, a.work / "run", a.workers).items():
        for src in trees.values():  # untimed: compile/cache numba kernels, warm the page cache
            once(src, args, a.work)
        for _ in range(a.n):
            for label, src in trees.items():
                times.setdefault((case, label), []).append(once(src, args, a.work))
    load1 = os.getloadavg()
    base, this = trees
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f}; {a.n} runs each; python {sys.version.split()[0]}")
    print(f"| case | {base} wall median (best) | {this} wall median (best) | wall {base} / this "
          f"| CPU median {base} | CPU median this |")
    print("|---|---|---|---|---|---|")
    for case in cases(log, a.work / "run", a.workers):
        (bw, bc), (tw, tc) = (list(zip(*times[(case, k)], strict=True)) for k in (base, this))
        print(f"| {case} | {statistics.median(bw):.2f} s ({min(bw):.2f}) | {statistics.median(tw):.2f} s "
              f"({min(tw):.2f}) | {statistics.median(bw) / statistics.median(tw):.2f}x | "
              f"{statistics.median(bc):.2f} s | {statistics.median(tc):.2f} s |")


if __name__ == "__main__":
    main()
