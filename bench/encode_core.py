"""Per-request encode overhead, compiled core vs the pure-Python reference, as ratios in one run (issue 30).

    .venv/bin/python bench/encode_core.py LOG.jsonl [--limit 12000] [--repeats 3]

Reads the first `--limit` accepted records of LOG through the read stage (untimed), then, alternating the
two paths (`encode_core.ENABLED`) `--repeats` times, encodes them with a fresh `RecordEncoder` (fresh
tokenizer, empty caches; one tokenizer thread; under `memory.fewer_collections` as analyze runs) in the
in-process batch size. The overhead is the main thread's CPU seconds in `RecordEncoder.encode` minus those
spent inside the tokenizer, per request: rendering, planning, memo look-ups, assembly, the block chain and
the glue around them. A checksum of every request's block hashes, token count, head and namespace must be
the same for both paths. Prints one line per run, then min and median per path and their ratios.
Works on a tree without the compiled core too (then only the pure path runs: a "before" figure).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.encoder import Hashed, RecordEncoder
from prefixscan.memory import fewer_collections
from prefixscan.pipeline.config import BATCH
from prefixscan.pipeline.read import Reader
from prefixscan.read.sources import expand

try:
    from prefixscan.encode import core as encode_core
except ImportError:  # a tree from before the compiled core
    encode_core = None  # type: ignore[assignment]


def one_run(cfg: AnalyzeConfig, batches: list, compiled: bool) -> tuple[float, float, str]:
    """(main-thread CPU s, of which in the tokenizer, checksum) of encoding every batch once."""
    if encode_core is not None:
        encode_core.ENABLED = compiled
    enc = RecordEncoder(cfg, False)
    tok = enc.load()
    tok.checked = 8  # the run-time self-check encodes its first requests twice: not part of the steady state
    inner, spent = tok.seg.encode_many, [0.0]

    def timed(texts: list[str]) -> list[list[int]]:
        t = time.thread_time()
        out = inner(texts)
        spent[0] += time.thread_time() - t
        return out

    tok.seg.encode_many = timed
    dig = hashlib.sha256()
    t0 = time.thread_time()
    for b in batches:
        for h in enc.encode(b):
            if isinstance(h, Hashed):
                dig.update(h.hashes.tobytes())
                dig.update(repr((h.n_tokens, h.head_tokens, h.root)).encode())
    return time.thread_time() - t0, spent[0], dig.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--limit", type=int, default=12000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    cfg = AnalyzeConfig(inputs=(a.log,), threads=1)
    batches, n = [], 0
    for ev in Reader(cfg, expand([a.log]), BATCH).events():
        if isinstance(ev, list) and n < a.limit:
            batches.append(ev[: a.limit - n])
            n += len(batches[-1])
    paths = (False, True) if encode_core is not None and encode_core._compiled is not None else (False,)
    per: dict[bool, list[float]] = {p: [] for p in paths}
    sums: dict[bool, set[str]] = {p: set() for p in paths}
    with fewer_collections():
        for rep in range(a.repeats):
            for p in paths:
                cpu, tok, dig = one_run(cfg, batches, p)
                per[p].append((cpu - tok) / n * 1e3)
                sums[p].add(dig)
                print(f"repeat {rep} {'compiled' if p else 'pure':8s} cpu {cpu:.3f} s, tokenizer {tok:.3f} s, "
                      f"overhead {per[p][-1]:.4f} ms/request, checksum {dig}", flush=True)
    for p in paths:
        print(f"{'compiled' if p else 'pure':8s} overhead min {min(per[p]):.4f} median "
              f"{statistics.median(per[p]):.4f} ms/request over {n} requests; checksums {sorted(sums[p])}")
    if len(paths) == 2:
        print(f"pure / compiled: min {min(per[False]) / min(per[True]):.2f}x, median "
              f"{statistics.median(per[False]) / statistics.median(per[True]):.2f}x; "
              f"same checksums: {sums[False] == sums[True] and len(sums[True]) == 1}")


if __name__ == "__main__":
    main()
