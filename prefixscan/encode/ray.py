"""The encode stage (render, tokenise, hash) on a Ray cluster: a hash-partitioned map and reduce.

1. **Read** (map): each input file is read and normalised by one encode actor, which splits its text
   records into `parts` lists by the conversation they are pinned to (`encode.pin_hash`: conversation id,
   else the start of the prompt), in input order. Each list is its own object in Ray's object store.
2. **Encode** (reduce): partition p is the lists p of every file, concatenated in file order (input order),
   so every turn of one conversation is encoded by one actor, in order, against a warm segment memo and
   chain cache. The driver hands partitions, largest first, to whichever actor is free.
3. **Collect**: each partition comes back as one Arrow table (ENCODED_SCHEMA; block hashes as one flat
   uint64 array plus offsets) and the driver writes it as a Parquet file in its own work folder (so the
   actors need no shared disk). The driver's ingest then looks those rows up (`engine.PrecomputedEncoder`).

A hash partition instead of Ray Data's groupby: no sort, no aggregator actors, one copy of each record
through the object store (docs/scale.md has the measurements). The memo and chain cache are exact by
construction, so the hashes do not depend on which actor encoded a record (tests/test_ray_engine.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.encoder import Hashed, RecordEncoder, pin_hash
from prefixscan.encode.ray_check import require_ray
from prefixscan.encode.ray_records import text_records
from prefixscan.errors import EnvError, PrefixscanError
from prefixscan.read.sources import Source

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


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def split_file(cfg: AnalyzeConfig, src: Source, f: int, parts: int) -> list[list[tuple[int, int, int, Any]]]:
    """One input file's text records as `parts` lists of (file, line, sub, record), in input order, each
    record in the list of its conversation's partition."""
    out: list[list[tuple[int, int, int, Any]]] = [[] for _ in range(parts)]
    for sub, rec in text_records(cfg, src):
        out[pin_hash(rec) % parts].append((f, rec.source_line, sub, rec))
    return out


def encoded_table(rows: list[tuple[int, int, int, Any]], results: list[Any]) -> pa.Table:
    """Records and their encodings as one ENCODED_SCHEMA table; the block hashes are one flat uint64
    array with offsets (no Python list per request)."""
    ok = [isinstance(e, Hashed) for e in results]
    lengths = np.array([len(e.hashes) if o else 0 for e, o in zip(results, ok, strict=True)], dtype=np.int64)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    parts = [np.asarray(e.hashes, dtype=np.uint64) for e, o in zip(results, ok, strict=True) if o]
    flat = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    hashes = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, type=pa.uint64()),
                                           mask=pa.array([not o for o in ok])).cast(pa.list_(pa.uint64()))
    cols = {
        "file": pa.array([r[0] for r in rows], pa.int32()), "line": pa.array([r[1] for r in rows], pa.int64()),
        "sub": pa.array([r[2] for r in rows], pa.int32()),
        "request_id": pa.array([r[3].request_id for r in rows], pa.string()),
        "root": pa.array([e.root if o else None for e, o in zip(results, ok, strict=True)], pa.uint64()),
        "n_tokens": pa.array([e.n_tokens if o else None for e, o in zip(results, ok, strict=True)], pa.int64()),
        "head_tokens": pa.array([e.head_tokens if o else None for e, o in zip(results, ok, strict=True)],
                                pa.int64()),
        "block_hashes": hashes,
        "reason": pa.array([None if o else e.reason for e, o in zip(results, ok, strict=True)], pa.string()),
        "detail": pa.array([None if o else e.detail for e, o in zip(results, ok, strict=True)], pa.string()),
    }
    return pa.table(cols, schema=ENCODED_SCHEMA)


class EncodeActor:
    """One per worker, alive for the job: reads files into partitions, and encodes whole partitions."""

    def __init__(self, cfg: AnalyzeConfig, sources: list[Source]) -> None:
        # One tokenizer thread unless --threads says otherwise: the actor holds one CPU, and the tokenizer's
        # default (a thread per core of the machine) had one actor already use every core, so a second
        # actor only oversubscribed them.
        cfg = replace(cfg, threads=cfg.threads or 1)
        self.cfg, self.sources = cfg, sources
        self.encoder = RecordEncoder(cfg, keep_tokens=False)
        self.encoder.load()  # the tokenizer, before the first call (start-up is its own phase)
        self.cpu = {"actor_start": time.process_time(), "read": 0.0, "encode": 0.0}

    def ready(self) -> bool:
        return True

    def cpu_seconds(self) -> dict[str, float]:
        """This actor's CPU seconds per phase: what it would take on a core of its own (a loaded machine
        stretches the wall time, not this)."""
        return dict(self.cpu)

    def read(self, f: int, parts: int) -> tuple[Any, ...]:
        """File `f` split into partitions, plus the records per partition (num_returns = parts + 1)."""
        t = time.process_time()
        out = split_file(self.cfg, self.sources[f], f, parts)
        self.cpu["read"] += time.process_time() - t
        return (*out, [len(x) for x in out])

    def encode(self, *lists: list[tuple[int, int, int, Any]]) -> pa.Table:
        """One partition (its list from every file, in file order): its records encoded in input order."""
        t = time.process_time()
        rows = [r for part in lists for r in part]
        recs = [r[3] for r in rows]
        results = [e for i in range(0, len(recs), ENCODE_BATCH) for e in self.encoder.encode(recs[i:i + ENCODE_BATCH])]
        out = encoded_table(rows, results)
        self.cpu["encode"] += time.process_time() - t
        return out


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
                  workers: int | None = None, phases: dict[str, float] | None = None) -> int:
    """Encode every text record of `sources` on Ray into Parquet files under `out_dir` (ENCODED_SCHEMA, one
    per partition); returns the number of encode actors used (0: nothing to encode, no cluster started).
    `phases`, if given, receives the wall seconds of each phase (docs/scale.md)."""
    ray = require_ray()
    if not has_text(cfg, sources):
        return 0
    clock = _Phases(phases)
    started = start(ray, address, workers)
    clock.done("cluster_start")
    actors: list[Any] = []
    try:
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        actor = ray.remote(num_cpus=1)(EncodeActor)
        actors = [actor.remote(cfg, sources) for _ in range(n)]
        ray.get([a.ready.remote() for a in actors])
        clock.done("actor_start")
        parts = n * PARTS_PER_WORKER
        split = [list(actors[f % n].read.options(num_returns=parts + 1).remote(f, parts))
                 for f in range(len(sources))]
        sizes = np.sum(ray.get([s[-1] for s in split]), axis=0)
        clock.done("read")
        Path(out_dir).mkdir(parents=True, exist_ok=True)

        def collect(p: int, table: pa.Table) -> None:
            pq.write_table(table, Path(out_dir) / f"part-{p:05d}.parquet")

        order = [int(p) for p in np.argsort(-sizes, kind="stable") if sizes[p]]
        _encode_parts(ray, actors, split, order, collect, clock)  # empties `split` as partitions finish
        if phases is not None:  # each phase's CPU seconds on its busiest actor, and summed over actors
            cpu = ray.get([a.cpu_seconds.remote() for a in actors])
            for k in cpu[0]:
                phases[f"cpu_max_{k}"] = max(c[k] for c in cpu)
                phases[f"cpu_sum_{k}"] = sum(c[k] for c in cpu)
        return n
    except ray.exceptions.RayError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, PrefixscanError):  # a bad input or tokenizer: the error the local path gives
            raise cause from None
        raise EnvError(f"the Ray encode stage failed: {str(exc).strip().splitlines()[0][:300]}") from None
    finally:
        for a in actors:
            ray.kill(a)
        if started:
            ray.shutdown()
        clock.done("shutdown")


def _encode_parts(ray: Any, actors: list[Any], split: list[list[Any]], order: list[int],
                  collect: Callable[[int, pa.Table], None], clock: _Phases) -> None:
    """Partitions in `order` to whichever actor is free (two in flight each); each result to `collect` as it
    arrives. `clock` splits the time into encoding and the driver's fetch and write (`collect`). A
    partition's record lists are released once it is encoded, so the object store can free them."""
    queue = list(reversed(order))
    inflight: dict[Any, tuple[int, Any]] = {}

    def submit(a: Any) -> None:
        if queue:
            p = queue.pop()
            inflight[a.encode.remote(*[s[p] for s in split])] = (p, a)

    for a in actors * 2:
        submit(a)
    collect_s = 0.0
    while inflight:
        done, _ = ray.wait(list(inflight), num_returns=1)
        p, a = inflight.pop(done[0])
        submit(a)
        for s in split:
            s[p] = None
        t = time.perf_counter()
        collect(p, ray.get(done[0]))
        collect_s += time.perf_counter() - t
    clock.done("encode", minus=collect_s)
    clock.add("collect", collect_s)


class _Phases:
    """Wall seconds per phase, into a caller's dict (or nowhere)."""

    def __init__(self, out: dict[str, float] | None) -> None:
        self.out = out if out is not None else {}
        self.t = time.perf_counter()

    def done(self, name: str, minus: float = 0.0) -> None:
        now = time.perf_counter()
        self.add(name, now - self.t - minus)
        self.t = now

    def add(self, name: str, s: float) -> None:
        self.out[name] = self.out.get(name, 0.0) + s


def read_encoded(out_dir: str) -> pa.Table:
    """What `encode_on_ray` wrote (every partition file), or an empty table when there was nothing to encode."""
    files = sorted(Path(out_dir).rglob("*.parquet")) if Path(out_dir).is_dir() else []
    if not files:
        return ENCODED_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(f).cast(ENCODED_SCHEMA) for f in files])
