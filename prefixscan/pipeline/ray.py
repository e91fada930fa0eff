"""`analyze --engine ray`: encode on a Ray cluster, the rest as the local pipeline.

1. encode: `ray_encode.encode_on_ray` renders, tokenises and hashes every text record on the cluster; the
   driver writes what comes back as one Parquet file per conversation partition;
2. the local pipeline (`prefixscan.pipeline`) reads the logs again on the driver for what depends on input
   order (rejects, duplicate ids, conversation inference, the findings' detector), taking each record's
   encoding from step 1 through `PrecomputedEncoder` (a forward cursor over the partition files, merged
   in input order) instead of tokenising it. Streamed in chunks like the local path (`--stream`, or by
   default above the size where the local path streams): the driver then holds one chunk, one batch of
   each partition file and the reuse state, not the log. Reuse, aggregates, capacity curve, findings and
   report are the local stages'.

The tables are the local path's, byte for byte; only the summary's tokenizer work counters and timings
differ (tests/test_ray_engine.py). The reuse stage is the pipeline's: the compiled scan, or with `--reuse
sql` the reuse SQL run once over the driver's spill of the log in DuckDB, out of core
(`pipeline/reuse_sql_stream.py`; docs/scale.md says why it runs on the spill, not on the partition files).
"""

from __future__ import annotations

import heapq
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan.config import AnalyzeConfig
from prefixscan.encode.encoder import Hashed, RecordEncoder, Rejected
from prefixscan.encode.ray import encode_on_ray
from prefixscan.encode.vllm_hash import has_lora_path
from prefixscan.pipeline.encode import Batch, Ingested, ingest
from prefixscan.read.record import Record
from prefixscan.read.sources import Source

ROWS_PER_BATCH = 4096  # encodings per partition file held by the driver at a time


class EncodedCursor:
    """The cluster's encodings in input order, one batch of each partition file in memory at a time.

    Each partition file is in input order (file, line, ordinal) already, so a merge of them is the whole
    log's order; the driver asks for records in that order too (skipping those it rejects), so a forward
    cursor finds every one. Of records with one id on one line (OTLP spans), the first is the one ingest
    keeps; a record asked for out of order is not found (and is then encoded on the driver, and counted)."""

    def __init__(self, out_dir: str) -> None:
        files = sorted(Path(out_dir).glob("*.parquet")) if Path(out_dir).is_dir() else []
        self.rows = heapq.merge(*(self._rows(f) for f in files))
        self.head = next(self.rows, None)
        self.key: tuple[int, int] | None = None
        self.line: dict[str, tuple[pa.RecordBatch, int]] = {}

    @staticmethod
    def _rows(path: Path) -> Iterator[tuple[int, int, int, str, pa.RecordBatch, int]]:
        for b in pq.ParquetFile(path).iter_batches(batch_size=ROWS_PER_BATCH):
            cols = [b.column(c).to_pylist() for c in ("file", "line", "sub", "request_id")]
            for i, key in enumerate(zip(*cols, strict=True)):
                yield (*key, b, i)

    def find(self, f: int, line: int, rid: str) -> tuple[pa.RecordBatch, int] | None:
        if (f, line) != self.key:
            while self.head is not None and (self.head[0], self.head[1]) < (f, line):
                self.head = next(self.rows, None)
            self.key, self.line = (f, line), {}
            while self.head is not None and (self.head[0], self.head[1]) == (f, line):
                self.line.setdefault(self.head[3], (self.head[4], self.head[5]))
                self.head = next(self.rows, None)
        return self.line.get(rid)


class PrecomputedEncoder(RecordEncoder):
    """A RecordEncoder that returns what the cluster encoded for each (file, line, id), read in input order
    from the partition files (`EncodedCursor`); a record it does not find (there should be none) is encoded
    here, and counted."""

    def __init__(self, cfg: AnalyzeConfig, out_dir: str, sources: list[Source], workers: int) -> None:
        super().__init__(cfg, keep_tokens=False)
        self.files = {s.path: i for i, s in enumerate(sources)}
        self.cursor = EncodedCursor(out_dir)
        self.looked_up = self.fallback = 0
        self.workers = workers

    @staticmethod
    def _take(b: pa.RecordBatch, i: int) -> Hashed | Rejected:
        reason = b.column("reason")[i].as_py()
        if reason is not None:
            return Rejected(reason, b.column("detail")[i].as_py())
        h = b.column("block_hashes")[i].values.to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
        return Hashed(int(b.column("root")[i].as_py()), int(b.column("n_tokens")[i].as_py()),
                      b.column("head_tokens")[i].as_py(), h, None)

    def encode(self, records: list[Record]) -> list[Hashed | Rejected]:
        self.load()  # the tokenizer's identity names the run (and the findings tokenise their rewrites)
        rows = [self.cursor.find(self.files.get(r.source_file, -1), r.source_line, r.request_id) for r in records]
        missing = [r for r, i in zip(records, rows, strict=True) if i is None]
        here = iter(super().encode(missing) if missing else [])
        self.fallback += len(missing)
        out: list[Hashed | Rejected] = []
        for r, row in zip(records, rows, strict=True):
            if row is None:
                out.append(next(here))
                continue
            self.looked_up += 1
            self.media_items += r.media_items
            if r.adapter and self.chains.hasher is not None and not has_lora_path(self.chains.lora_paths, r.adapter):
                self.lora_without_path += 1
            out.append(self._take(*row))
        return out

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "engine": "ray", "ray_encode_workers": self.workers,
                "ray_encoded": self.looked_up, "encoded_on_driver": self.fallback}


# Work folders whose streamed analysis met a log out of time order: `run` analyses them again as one chunk
# (pipeline.run catches OutOfOrder), and the second call takes the encodings the first one left.
_RETRY: dict[str, str] = {}


def ray_ingest(cfg: AnalyzeConfig, progress: Callable[[int, int, int], None] | None, sources: list[Source],
               work: Path, sink: Callable[[Batch], None] | None = None) -> Ingested:
    """Encode on the cluster, then the driver's ingest with the cluster's encodings, each Batch handed to
    `sink`: streamed in chunks with `--stream` (the driver holds one chunk and the reuse state), else as one
    chunk. The encodings go inside `work` (the run being built, or a scratch folder) and are removed here."""
    from prefixscan.pipeline.config import OutOfOrder, streams

    retry = _RETRY.pop(str(work), None)
    tmp = retry or tempfile.mkdtemp(prefix=".ray-work-", dir=str(work))
    keep = False
    try:
        out = str(Path(tmp) / "encoded")
        workers_file = Path(tmp) / "workers"
        if retry is None:
            workers_file.write_text(str(encode_on_ray(cfg, sources, out, cfg.ray_address, cfg.workers or None)))
        encoder = PrecomputedEncoder(cfg, out, sources, int(workers_file.read_text()))
        one_chunk = retry is not None or not streams(cfg, sources)
        try:
            return ingest(cfg, progress, sink=sink, sources=sources, one_chunk=one_chunk, encoder=encoder)
        except OutOfOrder:
            _RETRY[str(work)], keep = tmp, True
            raise
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
