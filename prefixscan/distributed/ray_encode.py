"""The encode stage (render, tokenise, hash) as Ray Data batches on a Ray cluster.

Files are read and normalised by Ray tasks (one per input file), each text record is keyed by the
conversation it is pinned to (`encode.pin_hash`: conversation id, else the start of its prompt) and
grouped by that key modulo a partition count, so every turn of one conversation is encoded by one actor,
in input order, against a warm segment memo and chain cache. The actors (one `RecordEncoder` each, alive
for the whole job) write one row per record to partitioned Parquet: its file and line, namespace, token
counts and block hashes, or why it could not be encoded. The driver's ingest then looks those rows up
(`engine.PrecomputedEncoder`) instead of encoding again.

The memo and chain cache are exact by construction, so the hashes do not depend on which actor encoded
a record (tests/test_ray_engine.py checks the run's tables against the local path).
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan.distributed.stages import AnalyzeConfig, Hashed, RecordEncoder, Source, pin_hash, text_records
from prefixscan.errors import EnvError

ENCODED_SCHEMA = pa.schema([
    pa.field("file", pa.int32(), nullable=False),
    pa.field("line", pa.int64(), nullable=False),
    pa.field("sub", pa.int32(), nullable=False),  # the record's place among those of its line (OTLP spans)
    pa.field("request_id", pa.string(), nullable=False),
    pa.field("root", pa.uint64()),
    pa.field("n_tokens", pa.int64()),
    pa.field("head_tokens", pa.int64()),
    pa.field("block_hashes", pa.list_(pa.uint64())),
    pa.field("reason", pa.string()),  # null: encoded; else the reject reason (detail beside it)
    pa.field("detail", pa.string()),
])
ENCODE_BATCH = 256  # records per tokenizer call inside an actor
PARTS_PER_WORKER = 4  # conversation partitions per encode actor (balance without splitting conversations)


def require_ray() -> Any:
    """The `ray` module, or an EnvError naming the extra that installs it."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise EnvError("--engine ray needs Ray Data: pip install 'prefixscan[ray]'") from None
    return ray


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def read_rows(row: dict[str, Any], cfg: AnalyzeConfig, sources: list[Source], parts: int) -> Iterator[dict[str, Any]]:
    """One input file's text records, keyed by their conversation partition."""
    f = int(row["file"])
    for sub, rec in text_records(cfg, sources[f]):
        yield {"part": pin_hash(rec) % parts, "file": f, "line": rec.source_line, "sub": sub,
               "request_id": rec.request_id, "rec": pickle.dumps(rec)}


def in_input_order(batch: pa.Table) -> pa.Table:
    """A conversation partition's records in input order (file, then line): its turns in order."""
    order = np.lexsort((batch.column("sub").to_numpy(), batch.column("line").to_numpy(),
                        batch.column("file").to_numpy()))
    return batch.take(pa.array(order))


class EncodeGroup:
    """A Ray actor's encoder: whole partitions of conversations, in input order."""

    def __init__(self, cfg: AnalyzeConfig) -> None:
        self.encoder = RecordEncoder(cfg, keep_tokens=False)

    def __call__(self, batch: pa.Table) -> pa.Table:
        batch = in_input_order(batch)  # a block may hold several partitions
        recs = [pickle.loads(b) for b in batch.column("rec").to_pylist()]
        out: dict[str, list[Any]] = {f.name: [] for f in ENCODED_SCHEMA}
        for c in ("file", "line", "sub", "request_id"):
            out[c] = batch.column(c).to_pylist()
        for i in range(0, len(recs), ENCODE_BATCH):
            for e in self.encoder.encode(recs[i:i + ENCODE_BATCH]):
                ok = isinstance(e, Hashed)
                out["root"].append(e.root if ok else None)
                out["n_tokens"].append(e.n_tokens if ok else None)
                out["head_tokens"].append(e.head_tokens if ok else None)
                out["block_hashes"].append(e.hashes if ok else None)
                out["reason"].append(None if ok else e.reason)
                out["detail"].append(None if ok else e.detail)
        hashes = pa.array([np.asarray(h, dtype=np.uint64) if h is not None else None for h in out.pop("block_hashes")],
                          type=pa.list_(pa.uint64()))
        t = pa.table({k: pa.array(v, type=ENCODED_SCHEMA.field(k).type) for k, v in out.items()})
        return t.append_column("block_hashes", hashes).select(ENCODED_SCHEMA.names).cast(ENCODED_SCHEMA)


def start(ray: Any, address: str | None, workers: int | None) -> bool:
    """Connect to a cluster (`address`) or start a local one sized to this machine; True if we started it."""
    if ray.is_initialized():
        return False
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    if address:
        ray.init(address=address, **quiet)
    else:
        ray.init(num_cpus=max(_cores(), workers or 1), **quiet)
    return True


def has_text(cfg: AnalyzeConfig, sources: list[Source]) -> bool:
    """Whether any input holds a text record (hashed traces have nothing to encode: no cluster is needed)."""
    return any(next(text_records(cfg, s), None) is not None for s in sources)  # stops at the first


def encode_on_ray(cfg: AnalyzeConfig, sources: list[Source], out_dir: str, address: str | None = None,
                  workers: int | None = None) -> int:
    """Encode every text record of `sources` on Ray into partitioned Parquet under `out_dir` (ENCODED_SCHEMA);
    returns the number of encode actors used (0: nothing to encode, no cluster started)."""
    ray = require_ray()
    if not has_text(cfg, sources):
        return 0
    started = start(ray, address, workers)
    log = logging.getLogger("ray.data")
    level = log.level
    log.setLevel(logging.ERROR)  # Ray Data reports every execution at INFO on stderr
    try:
        import ray.data
        from ray.data.context import ShuffleStrategy

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        # Sort-based grouping: a few tasks, no aggregator actors holding cores (Ray's hash shuffle took
        # 15 s on the 400-record sample log here, this 0.2 s).
        ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        parts = n * PARTS_PER_WORKER
        files = ray.data.from_items([{"file": i} for i in range(len(sources))],
                                    override_num_blocks=max(1, len(sources)))
        recs = files.flat_map(read_rows, fn_kwargs={"cfg": cfg, "sources": sources, "parts": parts})
        # Grouped first, by tasks, cut into `parts` blocks in partition order (a cut can fall inside a
        # partition: its halves are encoded apart, to the same hashes) and held in the object store; then one
        # actor per worker encodes whole blocks. Actors running beside those tasks would hold the cores the
        # tasks need.
        grouped = recs.groupby("part", num_partitions=parts).map_groups(in_input_order, batch_format="pyarrow")
        encoded = grouped.repartition(parts).materialize().map_batches(
            EncodeGroup, fn_constructor_args=(cfg,), compute=ray.data.ActorPoolStrategy(size=n), batch_size=None,
            batch_format="pyarrow")
        encoded.materialize().write_parquet(out_dir)  # the write's tasks start once the actors are gone
        return n
    finally:
        log.setLevel(level)
        if started:
            ray.shutdown()


def read_encoded(out_dir: str) -> pa.Table:
    """What `encode_on_ray` wrote (every partition file), or an empty table when there was nothing to encode."""
    files = sorted(Path(out_dir).rglob("*.parquet")) if Path(out_dir).is_dir() else []
    if not files:
        return ENCODED_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(f).cast(ENCODED_SCHEMA) for f in files])
