"""`prefixscan analyze` on one log at several source revisions, interleaved in one run (regressions, issue 15).

Each revision's `prefixscan/` is `git archive`d into a tree directory and put first on PYTHONPATH (kept
between runs with --tree-dir, so its compiled kernels stay cached); `work` is this checkout. Every tree
is warmed once on the log itself (numba compiles per source path), then timed `--repeats` times, the
order of the trees reversed every round so that drift in the machine's load falls on all alike. Prints
per tree the wall seconds (every run, median), CPU seconds, the manifest's stage timings (median) and
which files of its run directory differ from the first tree's (JSON without timings).

    .venv/bin/python bench/studies/trace_revisions.py bench/out/trace-1000000.jsonl --rev 7a3c28e --rev 973c53d \
        --tree-dir /tmp/ps-trees --repeats 3

Say the load average it prints: on a shared machine only the ratios in one run mean anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py

from common import revision_tree
from mainpath_stages import PY, ROOT, _analyze, _env, same_run

STAGES = ("ingest_s", "capacity_s", "aggregate_s", "attribution_s", "findings_s", "total_s")


def _trees(revs: list[str], tree_dir: Path, work: bool) -> dict[str, Path | None]:
    trees: dict[str, Path | None] = {}
    for rev in revs:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                             capture_output=True, text=True).stdout.strip()
        into = tree_dir / sha
        have = (into / "prefixscan").is_dir()
        trees[f"{rev} ({sha})" if sha != rev else rev] = into if have else revision_tree(sha, into)
    if work:
        trees["work"] = None
    return trees


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("--rev", action="append", default=[], help="a git revision to time (repeatable)")
    ap.add_argument("--no-work", action="store_true", help="leave out this checkout")
    ap.add_argument("--tree-dir", help="where the revisions' trees are unpacked and kept (default: temporary)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--extra", default="", help="more analyze options, space-separated")
    args = ap.parse_args()
    extra, inp = args.extra.split(), str(Path(args.input).resolve())
    scratch = Path(tempfile.mkdtemp(prefix="trace-revisions-"))
    tree_dir = Path(args.tree_dir).resolve() if args.tree_dir else scratch / "trees"
    try:
        trees = _trees(args.rev, tree_dir, not args.no_work)
        print(f"load average at start: {os.getloadavg()}; input {inp}; analyze options {extra}")
        for name, tree in trees.items():
            got = subprocess.run([PY, "-c", "import prefixscan; print(prefixscan.__file__)"], env=_env(tree),
                                 cwd=scratch, check=True, capture_output=True, text=True).stdout.strip()
            print(f"{name}: imports {got}")
            _analyze(inp, scratch / "warm" / "run", tree, extra)  # compiles and caches its kernels
        names = list(trees)
        runs: dict[str, list[tuple[float, float, dict]]] = {k: [] for k in names}
        for rep in range(args.repeats):
            for name in names if rep % 2 == 0 else names[::-1]:
                runs[name].append(_analyze(inp, scratch / f"run-{names.index(name)}", trees[name], extra))
                print(f"  round {rep + 1} {name}: {runs[name][-1][0]:.2f} s (load {os.getloadavg()[0]:.2f})",
                      flush=True)
        first = scratch / "run-0"
        print("| tree | wall s (runs) | median wall s | median CPU s | " + " | ".join(s[:-2] for s in STAGES)
              + " | differs from first tree |")
        print("|---|---|---:|---:|" + "---:|" * len(STAGES) + "---|")
        for i, name in enumerate(names):
            walls = [w for w, _, _ in runs[name]]
            cpu = median(c for _, c, _ in runs[name])
            st = " | ".join(f"{median(t.get(s, 0.0) for _, _, t in runs[name]):.2f}" for s in STAGES)
            diff = same_run(first, scratch / f"run-{i}") if i else []
            print(f"| {name} | {', '.join(f'{w:.2f}' for w in walls)} | {median(walls):.2f} | {cpu:.2f} | {st} | "
                  f"{', '.join(diff) if diff else '-'} |")
        print(f"load average at end: {os.getloadavg()}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
