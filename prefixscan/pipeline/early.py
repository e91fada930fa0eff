"""Start a run's encode workers before the rest of the pipeline is imported (docs/pipeline.md, "Start-up").

A spawned encode worker needs about a second before it encodes its first batch (a new interpreter, its
imports, the tokenizer's vocabulary). Started when the pool is first needed, that second is spent after
this process has imported polars, pyarrow and numba and read its first records, and the first batches
wait for it. Started here, from the command (or `prefixscan.analyze`) before those imports, it overlaps
them. Only a cheap guess is made: plain local files, the first line's shape a text one (a hashed trace
never uses the workers); anything else leaves the pool to start its workers when needed, as before. The
run's pool takes these workers only if it asks for the same options and count (`encode_workers.claim`), so
a wrong guess costs time on the other core, never a different result.
"""

from __future__ import annotations

import os

from prefixscan.config import AnalyzeConfig

_PLAIN = (".jsonl", ".ndjson", ".json")


def start_encode_workers(cfg: AnalyzeConfig) -> bool:
    """Start the encode workers `cfg`'s run will use, if it is sure to want them; True if started."""
    if cfg.engine != "local" or cfg.workers == 0:
        return False
    paths = list(cfg.inputs)
    if not paths or not all(p.lower().endswith(_PLAIN) and os.path.isfile(p) for p in paths):
        return False  # globs, directories, compressed, Parquet or remote inputs: decided later, as before
    from prefixscan.encode.encoder import auto_workers
    from prefixscan.pipeline.config import text_log, validate

    try:
        validate(cfg)
    except Exception:  # the run itself reports a bad option
        return False
    workers = auto_workers(cfg, sum(os.path.getsize(p) for p in paths))
    if not workers or not text_log(cfg, paths[0]):
        return False
    from prefixscan.pipeline.encode_workers import start_early

    start_early(cfg, cfg.granularity == "token", workers)
    return True
