"""Issue 18: the encode stage on Ray with 1 and 2 workers, and the per-core rates of docs/scale.md.

    .venv/bin/python bench/studies/ray_encode_scaling.py [--requests 3000] [--repeats 2]
        [--output bench/studies/results-ray.md]

Never part of `make test`. Makes a synthetic chat log (fixed seed), then measures in one process on one
core: reading (parse + normalise), encoding (render + tokenise + hash), the reuse scan (compiled) and the
reuse SQL (DuckDB, one thread); then the Ray encode stage on a local 2-CPU cluster with 1 and 2 encode
actors, alternating, `repeats` times each (medians). The load average is printed before and after: on a
shared machine the ratio is what to read, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import pyarrow.parquet as pq

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.encoder import RecordEncoder
from prefixscan.encode.ray import encode_on_ray, read_encoded
from prefixscan.encode.ray_records import text_records
from prefixscan.pipeline.run import run_analysis
from prefixscan.read.sources import expand
from prefixscan.reuse import sql as reuse_sql
from prefixscan.reuse.ideal import IdealStream, scope_salts


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def per_core_rates(log: Path, work: Path) -> dict[str, float]:
    """Single-process rates of each stage on this log (one tokenizer thread, as in an encode actor)."""
    cfg = AnalyzeConfig(inputs=(str(log),), threads=1)
    src = expand([str(log)])
    t = time.perf_counter()
    recs = [r for _, r in text_records(cfg, src[0])]
    read_s = time.perf_counter() - t
    enc = RecordEncoder(cfg, keep_tokens=False)
    enc.load()
    t = time.perf_counter()
    out = [e for i in range(0, len(recs), 256) for e in enc.encode(recs[i:i + 256])]
    encode_s = time.perf_counter() - t
    tokens = sum(getattr(e, "n_tokens", 0) for e in out)
    run = run_analysis(AnalyzeConfig(inputs=(str(log),), output=str(work / "run"), findings=False, force=True))
    req = pq.read_table(Path(run.run_dir) / "requests.parquet")
    lists = req.column("block_hashes").combine_chunks()
    offsets, flat = lists.offsets.to_numpy().astype(np.int64), lists.values.to_numpy()
    IdealStream().add(offsets[:2], flat[:offsets[1]], req.column("prompt_tokens").to_numpy()[:1], 16, "vllm",
                      np.zeros(1, np.uint64), np.zeros(1, np.uint64))  # load the compiled kernels first
    t = time.perf_counter()
    IdealStream().add(offsets, flat, req.column("prompt_tokens").to_numpy(), 16, "vllm",
                      scope_salts(req.column("tenant").to_pylist()),
                      scope_salts(req.column("conversation_id").to_pylist()))
    scan_s = time.perf_counter() - t
    t = time.perf_counter()
    with reuse_sql.connect("2GB", threads=1) as con:
        reuse_sql.views_of_requests(con, str(Path(run.run_dir) / "requests.parquet"))
        reuse_sql.run_reuse(con, 16, "vllm")
    sql_s = time.perf_counter() - t
    return {"bytes": log.stat().st_size, "records": len(recs), "tokens": tokens, "block_refs": len(flat),
            "read_MBps": log.stat().st_size / read_s / 1e6, "encode_tokens_per_s": tokens / encode_s,
            "encode_records_per_s": len(recs) / encode_s, "scan_refs_per_s": len(flat) / scan_s,
            "sql_refs_per_s": len(flat) / sql_s}


def split_log(log: Path, files: int) -> list[Path]:
    """The log cut into `files` consecutive pieces of whole lines (logs arrive sharded: one file per hour or
    per server); the read phase reads one file per actor call."""
    lines = log.read_bytes().splitlines(keepends=True)
    step = -(-len(lines) // files)
    out = []
    for i in range(files):
        p = log.parent / "shards" / f"chat-{i:02d}.jsonl"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"".join(lines[i * step:(i + 1) * step]))
        out.append(p)
    return out


def ray_encode(logs: list[Path], work: Path, repeats: int) -> dict[int, list[dict[str, float]]]:
    """The Ray encode stage with 1 and 2 actors, alternating; each run's wall seconds per phase."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    cfg = AnalyzeConfig(inputs=tuple(str(p) for p in logs))
    src = expand([str(p) for p in logs])
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    try:
        encode_on_ray(cfg, src, str(work / "warm"), workers=2)  # workers import prefixscan, numba caches
        for r in range(repeats):
            for n in (1, 2):
                out = work / f"enc-{n}-{r}"
                phases: dict[str, float] = {}
                t = time.perf_counter()
                encode_on_ray(cfg, src, str(out), workers=n, phases=phases)
                phases["total"] = time.perf_counter() - t
                runs[n].append(phases)
                assert read_encoded(str(out)).num_rows == rates_records(cfg, src)
    finally:
        ray.shutdown()
    return runs


def rates_records(cfg: AnalyzeConfig, src: list) -> int:
    return sum(1 for s in src for _ in text_records(cfg, s))


PHASES = ("actor_start", "read", "encode", "collect", "total")
CPU_PHASES = ("actor_start", "read", "encode")


def phase_table(runs: dict[int, list[dict[str, float]]]) -> list[str]:
    """Median wall seconds of each phase per worker count (every run's total beside it), then the actors'
    CPU seconds per phase: on the busiest actor (the critical path on idle cores) and summed (the work)."""
    lines = ["| wall s, local 2-CPU cluster | " + " | ".join(PHASES) + " | runs (total s) |",
             "|---" * (len(PHASES) + 2) + "|"]
    for n, rs in runs.items():
        med = [statistics.median(r.get(p, 0.0) for r in rs) for p in PHASES]
        lines.append(f"| {n} worker{'s' if n > 1 else ''} | " + " | ".join(f"{m:.2f}" for m in med)
                     + " | " + ", ".join(f"{r['total']:.2f}" for r in rs) + " |")
    lines += ["", "| actors' CPU s (busiest actor / sum) | " + " | ".join(CPU_PHASES) + " |",
              "|---" * (len(CPU_PHASES) + 1) + "|"]
    for n, rs in runs.items():
        cells = [f"{statistics.median(r[f'cpu_max_{p}'] for r in rs):.2f} / "
                 f"{statistics.median(r[f'cpu_sum_{p}'] for r in rs):.2f}" for p in CPU_PHASES]
        lines.append(f"| {n} worker{'s' if n > 1 else ''} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--files", type=int, default=4, help="shards the log is cut into for the Ray runs")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    from prefixscan.synth import write
    from prefixscan.synth.config import SynthConfig

    with tempfile.TemporaryDirectory(prefix="row9-") as tmp:
        work = Path(tmp)
        log = work / "chat.jsonl"
        write(SynthConfig(requests=args.requests, seed=18), str(log), truth_path=None)
        before = load()
        rates = per_core_rates(log, work)
        runs = ray_encode(split_log(log, args.files), work, args.repeats)
        after = load()
    m1, m2 = (statistics.median(r["total"] for r in runs[n]) for n in (1, 2))
    e1, e2 = (statistics.median(r["encode"] for r in runs[n]) for n in (1, 2))
    c1, c2 = (statistics.median(sum(r[f"cpu_max_{p}"] for p in ("read", "encode")) for r in runs[n]) for n in (1, 2))
    lines = [
        "# The encode stage on Ray (issue 18)", "",
        f"Command: `.venv/bin/python bench/studies/ray_encode_scaling.py --requests {args.requests} --repeats "
        f"{args.repeats} --files {args.files}`; {os.cpu_count()} CPUs, load average {before} before and {after} "
        "after.", "",
        f"Input: synthetic chat log (cut into {args.files} files for the Ray runs), {rates['records']:,} requests, "
        f"{rates['bytes'] / 1e6:.1f} MB, "
        f"{rates['tokens']:,} prompt tokens, {rates['block_refs']:,} block references.", "",
        "| stage (one process, one core) | rate |", "|---|---|",
        f"| read (parse + normalise) | {rates['read_MBps']:.1f} MB/s |",
        f"| encode (render + tokenise + hash) | {rates['encode_tokens_per_s'] / 1e6:.2f} M tokens/s "
        f"({rates['encode_records_per_s']:,.0f} requests/s) |",
        f"| reuse, compiled scan | {rates['scan_refs_per_s'] / 1e6:.1f} M block refs/s |",
        f"| reuse, DuckDB SQL (1 thread) | {rates['sql_refs_per_s'] / 1e6:.2f} M block refs/s |", "",
        "Wall seconds per phase (medians; `ray_encode.encode_on_ray(phases=...)`): actor_start = the encode "
        "actors' start-up (import, tokenizer load), read = files read, normalised and hash-partitioned by "
        "conversation into the object store, encode = every partition encoded (largest first, to the free "
        "actor), collect = the driver fetching each partition's Arrow table and writing it as Parquet "
        "(overlapping the encode of the next); the local cluster is started once, before.", "",
        *phase_table(runs), "",
        f"Speed-up 1 -> 2 workers: {m1 / m2:.2f}x end to end (wall), {e1 / e2:.2f}x in the encode phase (wall); "
        f"{c1 / c2:.2f}x on the critical path of read + encode in CPU seconds (the busiest actor's), which is "
        "what idle cores would show.", ""]
    text = "\n".join(lines)
    print(text)
    if args.output:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
