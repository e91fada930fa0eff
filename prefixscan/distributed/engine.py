"""`analyze --engine ray`: encode on a Ray cluster, reuse as SQL in DuckDB, the rest as the local path.

1. encode: `ray_encode.encode_on_ray` renders, tokenises and hashes every text record on the cluster and
   writes the encodings as partitioned Parquet;
2. ingest: the local ingest reads the logs again on the driver for what depends on input order (rejects,
   duplicate ids, conversation inference, the findings' detector), taking each record's encoding from
   step 1 through `PrecomputedEncoder` instead of tokenising it;
3. reuse: the requests and their block references are written as partitioned Parquet and the ideal-cache
   columns come from `reuse_sql` (group-by and joins, out of core), not from the compiled scan;
4. aggregates, capacity curve, findings, report: the local functions, on the same frames.

The tables are the local path's, byte for byte; only the summary's tokenizer work counters and timings
differ (tests/test_ray_engine.py).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from prefixscan.distributed import reuse_sql
from prefixscan.distributed.ray_encode import encode_on_ray, read_encoded, require_ray
from prefixscan.distributed.stages import (
    AnalyzeConfig,
    Hashed,
    Ingested,
    Record,
    RecordEncoder,
    Rejected,
    Source,
    dense_ids,
    has_lora_path,
    ingest,
    input_frame,
    reuse_frame,
)
from prefixscan.errors import UsageError

REUSE_MEMORY = "2GB"  # DuckDB's budget for the reuse query; it spills to the work directory past it
BLOCK_BUCKETS = 16  # hash partitions of the block table (each bucket's group-by is independent)


def check(cfg: AnalyzeConfig) -> None:
    """Options the Ray engine cannot honour, as usage errors; Ray itself must be importable."""
    if cfg.granularity != "block":
        raise UsageError("--engine ray measures block granularity; drop --granularity token")
    if cfg.streaming:
        raise UsageError("--engine ray analyses the encoded log on the driver in memory; drop --stream")
    require_ray()


class PrecomputedEncoder(RecordEncoder):
    """A RecordEncoder that returns what the cluster encoded for each (file, line); a record it does not find
    (there should be none) is encoded here, and counted."""

    def __init__(self, cfg: AnalyzeConfig, encoded: pa.Table, sources: list[Source], workers: int) -> None:
        super().__init__(cfg, keep_tokens=False)
        self.files = {s.path: i for i, s in enumerate(sources)}
        # Keyed by file, line and request id: a line can hold several records (OTLP spans); of records with
        # one id on one line, the first is the one ingest keeps (later ones are duplicates, never looked up).
        cols = [encoded.column(c).to_pylist() for c in ("file", "line", "request_id", "sub")]
        self.row: dict[tuple[int, int, str], int] = {}
        for i in sorted(range(encoded.num_rows), key=lambda i: cols[3][i], reverse=True):
            self.row[(cols[0][i], cols[1][i], cols[2][i])] = i
        self.t = encoded
        self.hashes = encoded.column("block_hashes").combine_chunks()
        self.looked_up = self.fallback = 0
        self.workers = workers

    def _take(self, i: int) -> Hashed | Rejected:
        reason = self.t.column("reason")[i].as_py()
        if reason is not None:
            return Rejected(reason, self.t.column("detail")[i].as_py())
        head = self.t.column("head_tokens")[i].as_py()
        h = self.hashes[i].values.to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
        return Hashed(int(self.t.column("root")[i].as_py()), int(self.t.column("n_tokens")[i].as_py()), head, h, None)

    def encode(self, records: list[Record]) -> list[Hashed | Rejected]:
        self.load()  # the tokenizer's identity names the run (and the findings tokenise their rewrites)
        rows = [self.row.get((self.files.get(r.source_file, -1), r.source_line, r.request_id)) for r in records]
        missing = [r for r, i in zip(records, rows, strict=True) if i is None]
        here = iter(super().encode(missing) if missing else [])
        self.fallback += len(missing)
        out: list[Hashed | Rejected] = []
        for r, i in zip(records, rows, strict=True):
            if i is None:
                out.append(next(here))
                continue
            self.looked_up += 1
            self.media_items += r.media_items
            if r.adapter and self.chains.hasher is not None and not has_lora_path(self.chains.lora_paths, r.adapter):
                self.lora_without_path += 1
            out.append(self._take(i))
        return out

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "engine": "ray", "ray_encode_workers": self.workers,
                "ray_encoded": self.looked_up, "encoded_on_driver": self.fallback}


def ray_ingest(cfg: AnalyzeConfig, progress: Callable[[int, int, int], None] | None, sources: list[Source],
               work: str) -> Ingested:
    """Steps 1 and 2: encode on the cluster, then the driver's ingest with the cluster's encodings."""
    out = str(Path(work) / "encoded")
    workers = encode_on_ray(cfg, sources, out, cfg.ray_address, cfg.workers or None)
    encoder = PrecomputedEncoder(cfg, read_encoded(out), sources, workers)
    return ingest(cfg, progress, sources=sources, encoder=encoder)


def write_reuse_inputs(inp: pl.DataFrame, offsets: np.ndarray, flat: np.ndarray, work: str) -> tuple[str, str]:
    """The requests (`reqs`) and block references (`blocks`, hive-partitioned by hash bucket) as Parquet."""
    n = inp.height
    lengths = np.diff(offsets)
    reqs = pa.table({"pos": pa.array(np.arange(n, dtype=np.int64)), "n_blocks": pa.array(lengths),
                     "prompt_tokens": inp["prompt_tokens"].to_arrow(), "tenant": inp["tenant"].to_arrow(),
                     "conv": inp["conversation_id"].to_arrow()})
    blocks = pa.table({"pos": pa.array(np.repeat(np.arange(n, dtype=np.int64), lengths)),
                       "idx": pa.array(np.arange(len(flat), dtype=np.int64) - np.repeat(offsets[:-1], lengths)),
                       "h": pa.array(np.asarray(flat, dtype=np.uint64))})
    blocks = blocks.append_column("bucket", pc.bit_wise_and(blocks.column("h"), pa.scalar(BLOCK_BUCKETS - 1,
                                                                                              pa.uint64())))
    rdir, bdir = str(Path(work) / "reqs"), str(Path(work) / "blocks")
    ds.write_dataset(reqs, rdir, format="parquet", max_rows_per_file=1 << 20, max_rows_per_group=1 << 17)
    ds.write_dataset(blocks, bdir, format="parquet", partitioning=["bucket"], partitioning_flavor="hive",
                     max_rows_per_file=1 << 22, max_rows_per_group=1 << 17)
    return rdir, bdir


def sql_reuse(cfg: AnalyzeConfig, ing: Ingested, work: str):  # noqa: ANN201 - analysis._reuse's tuple
    """Step 3: `analysis._reuse`'s outputs, with the ideal-cache columns from the reuse SQL."""
    inp, offsets, flat, snippets, _, _ = input_frame(cfg, ing)
    n = inp.height
    if n:
        rdir, bdir = write_reuse_inputs(inp, offsets, flat, work)
        with reuse_sql.connect(REUSE_MEMORY, temp_directory=work) as con:
            reuse_sql.views_of_parquet(con, rdir, bdir)
            t = reuse_sql.run_reuse(con, ing.block_size, ing.hit_rule)
    else:
        t = reuse_sql.reuse_of_requests(_empty_requests(), ing.block_size, ing.hit_rule)
    res = reuse_sql.ideal_result(t, n)
    ids = dense_ids(flat)  # the capacity curve's dense ids: first-appearance order, as the compiled scan's
    rid = inp["request_id"]
    source_ids = (rid.gather(pl.Series(np.maximum(res.source, 0))).set(pl.Series(res.source < 0), None) if n
                  else pl.Series("source_request_id", [], dtype=pl.String))
    ts0 = float(inp["timestamp_s"][0]) if n else 0.0
    df, deepest = reuse_frame(inp, offsets, flat, res, res.cached_tokens, res.divergence_token, ing.block_size,
                              ing.hit_rule, seq0=0, ts0=ts0, source_ids=source_ids, turn_counts=None)
    return df, offsets, flat, deepest, snippets, ids


def _empty_requests() -> pa.Table:
    return pa.table({"seq": pa.array([], pa.int64()), "prompt_tokens": pa.array([], pa.int64()),
                     "tenant": pa.array([], pa.string()), "conversation_id": pa.array([], pa.string()),
                     "block_hashes": pa.array([], pa.list_(pa.uint64()))})


def ingest_and_reuse(cfg: AnalyzeConfig, progress: Callable[[int, int, int], None] | None, sources: list[Source],
                     run_path: Path | None, done: Callable[[str, float], float], t0: float):  # noqa: ANN201
    """Steps 1-3 for `analysis._analyse`: (ingested, `_reuse`'s tuple, start of the next stage). The
    intermediate Parquet goes inside the run being built (or a temporary folder) and is removed here."""
    work = tempfile.mkdtemp(prefix=".ray-work-", dir=str(run_path) if run_path is not None else None)
    try:
        ing = ray_ingest(cfg, progress, sources, work)
        t = done("ingest", t0)
        return ing, sql_reuse(cfg, ing, work), t
    finally:
        shutil.rmtree(work, ignore_errors=True)
