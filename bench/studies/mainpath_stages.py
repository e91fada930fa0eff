"""Main-process stages (read, reuse, capacity, write) before and after, as ratios in one run (issue 15).

Runs `prefixscan analyze` from two source trees on the same inputs, alternately, and reports each one's
wall time, its CPU time (process and encode workers: less sensitive to a shared machine's load than the
wall; also the main process's alone, `main_cpu_s`, the critical path with encode workers, and how long it
waited for them, `wait_s_main`), its stage timings (manifest `analyze.timings`) and whether every table
and the summary are the same (every file of the run directory byte for byte; the manifest without RUN_STATS). The
"before" tree is `git archive REV prefixscan` unpacked in a scratch directory and put first on
PYTHONPATH; the "after" tree is this checkout. Also times the read stage's record normalisation alone
(CPU seconds, `shapes.normalise` over already-parsed lines) on each JSONL chat input.

    .venv/bin/python bench/studies/mainpath_stages.py --base 973c53d INPUT.jsonl [INPUT ...] [--repeats 2]

Say the load average it prints: on a shared machine only the ratios mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py

from common import revision_tree

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
NORMALISE = """
import sys, time, orjson
from prefixscan.read.shapes import detect, normalise
objs = [orjson.loads(x) for x in open(sys.argv[1], 'rb') if x.strip()]
shape = detect(objs[0])
t = time.process_time()
for i, o in enumerate(objs):
    normalise(o, shape, 'f', i + 1, {}, {})
print(time.process_time() - t)
"""


def _env(pythonpath: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def _analyze(inp: str, out: Path, pythonpath: Path | None, extra: list[str]) -> tuple[float, float, dict]:
    """(wall s, CPU s of the process and its encode workers, the manifest's stage timings)."""
    t, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    # Not run from the checkout: `python -m` puts the working directory first on sys.path, before PYTHONPATH
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([PY, "-m", "prefixscan", "analyze", inp, "-o", str(out), "--force", "-q", *extra],
                   check=True, env=_env(pythonpath), cwd=out.parent, stdout=subprocess.DEVNULL)
    wall, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    analyze = json.loads((out / "manifest.json").read_text())["analyze"]
    timings = dict(analyze["timings"])
    stats = analyze["summary"]["input"].get("tokenizer_stats") or {}
    # the ingesting process is the critical path on a busy machine too: its CPU, without the workers'
    timings["main_cpu_s"] = cpu - stats.get("cpu_s_workers", 0.0)
    timings["wait_s_main"] = stats.get("wait_s_main", 0.0)
    return wall, cpu, timings


# Not results: wall times, the command and run directory, and the encode pool's work split between the
# main process and the workers (adaptive, so it follows the machine's load; the tables do not).
RUN_STATS = ("timings", "command_line", "output", "tokenizer_stats")


def _strip(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in RUN_STATS}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def same_run(a: Path, b: Path) -> list[str]:
    """The files of two run directories that differ (JSON compared without timings)."""
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    bad = []
    for name in names:
        pa_, pb_ = a / name, b / name
        if not (pa_.exists() and pb_.exists()):
            bad.append(f"{name} (missing)")
        elif name.endswith(".json"):
            if _strip(json.loads(pa_.read_text())) != _strip(json.loads(pb_.read_text())):
                bad.append(name)
        elif pa_.read_bytes() != pb_.read_bytes():
            bad.append(name)
    return bad


def _normalise_cpu(inp: str, pythonpath: Path | None, cwd: Path) -> float | None:
    if not inp.endswith(".jsonl"):
        return None
    with open(inp, "rb") as f:
        head = f.readline()
    if b'"messages"' not in head:
        return None
    got = subprocess.run([PY, "-c", NORMALISE, inp], check=True, env=_env(pythonpath), cwd=cwd,
                         capture_output=True, text=True)
    return float(got.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--base", required=True, help="git revision of the 'before' tree")
    ap.add_argument("--before-dir", help="an unpacked 'before' tree to reuse (its compiled kernels cached)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--extra", default="", help="more analyze options, space-separated")
    args = ap.parse_args()
    extra = args.extra.split()
    work = Path(tempfile.mkdtemp(prefix="mainpath-bench-"))
    try:
        before = Path(args.before_dir) if args.before_dir else revision_tree(args.base, work / "before")
        if not (before / "prefixscan" / "__init__.py").is_file():  # else both runs would import this checkout
            ap.error(f"--before-dir {before} holds no prefixscan/ package")
        trees: dict[str, Path | None] = {"before": before, "after": None}
        print(f"load average at start: {os.getloadavg()}; before = {args.base}, after = working tree")
        for name, tree in trees.items():  # each tree imports its own package
            got = subprocess.run([PY, "-c", "import prefixscan; print(prefixscan.__file__)"], env=_env(tree),
                                 cwd=work, check=True, capture_output=True, text=True).stdout.strip()
            print(f"{name}: {got}")
        for tree in trees.values():  # compiled kernels cached and files warm before anything is timed
            _analyze(str(ROOT / "sample_logs" / "mooncake_small.jsonl"), work / "warm", tree, [])
            _analyze(str(ROOT / "sample_logs" / "chat.jsonl"), work / "warm", tree, [])
        print("| input | before wall s | after wall s | ratio | before CPU s | after CPU s | CPU ratio | "
              "stage timings before -> after | normalise CPU s before -> after | tables identical |")
        print("|---|---:|---:|---:|---:|---:|---:|---|---|---|")
        for inp in map(lambda p: str(Path(p).resolve()), args.inputs):
            walls: dict[str, list[float]] = {k: [] for k in trees}
            cpus: dict[str, list[float]] = {k: [] for k in trees}
            stages: dict[str, dict] = {}
            for _ in range(args.repeats):
                for name, tree in trees.items():
                    w, c, stages[name] = _analyze(inp, work / name / "run", tree, extra)
                    walls[name].append(w)
                    cpus[name].append(c)
            diff = same_run(work / "before" / "run", work / "after" / "run")
            norm = {k: _normalise_cpu(inp, t, work) for k, t in trees.items()}
            b, a = min(walls["before"]), min(walls["after"])
            cb, ca = min(cpus["before"]), min(cpus["after"])
            keys = [k for k in ("ingest_s", "capacity_s", "aggregate_s", "attribution_s", "findings_s")
                    if k in stages["after"]]
            # start-up, writing the run and exit: the wall time outside the manifest's timed stages
            outside = {k: walls[k][-1] - stages[k].get("total_s", 0) for k in trees}  # of the last repeat
            st = ", ".join(f"{k[:-2]} {stages['before'].get(k, 0):.2f}->{stages['after'][k]:.2f}" for k in keys)
            st += f", outside stages {outside['before']:.2f}->{outside['after']:.2f}"
            st += "".join(f", {k} {stages['before'].get(k, 0):.2f}->{stages['after'][k]:.2f}"
                          for k in ("main_cpu_s", "wait_s_main"))
            ns = f"{norm['before']:.2f} -> {norm['after']:.2f}" if norm["after"] is not None else "-"
            print(f"| {Path(inp).name} | {b:.2f} | {a:.2f} | {b / a:.2f}x | {cb:.2f} | {ca:.2f} | {cb / ca:.2f}x "
                  f"| {st} | {ns} | {'yes' if not diff else 'NO: ' + ', '.join(diff)} |", flush=True)
        print(f"load average at end: {os.getloadavg()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
