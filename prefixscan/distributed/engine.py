"""`analyze --engine ray`: encode on a Ray cluster, the rest as the local pipeline's one-chunk path.

1. encode: `ray_encode.encode_on_ray` renders, tokenises and hashes every text record on the cluster and
   writes the encodings as partitioned Parquet;
2. the local pipeline (`prefixscan.pipeline.run`, as one chunk) reads the logs again on the driver for what
   depends on input order (rejects, duplicate ids, conversation inference, the findings' detector), taking
   each record's encoding from step 1 through `PrecomputedEncoder` instead of tokenising it; reuse,
   aggregates, capacity curve, findings and report are the local stages'.

The tables are the local path's, byte for byte; only the summary's tokenizer work counters and timings
differ (tests/test_ray_engine.py). The reuse SQL (`reuse_sql`, out of core in DuckDB) computes the same
ideal-cache columns (tests/test_reuse_sql.py); the pipeline's reuse stage does not call it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from prefixscan.distributed.ray_encode import encode_on_ray, read_encoded, require_ray
from prefixscan.distributed.stages import (
    AnalyzeConfig,
    Batch,
    Hashed,
    Ingested,
    Record,
    RecordEncoder,
    Rejected,
    Source,
    has_lora_path,
    ingest,
)
from prefixscan.errors import UsageError


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
               work: Path, sink: Callable[[Batch], None] | None = None) -> Ingested:
    """Encode on the cluster, then the driver's one-chunk ingest with the cluster's encodings, each Batch
    handed to `sink`. The encodings go inside `work` (the run being built, or a scratch folder) and are
    removed here."""
    tmp = tempfile.mkdtemp(prefix=".ray-work-", dir=str(work))
    try:
        out = str(Path(tmp) / "encoded")
        workers = encode_on_ray(cfg, sources, out, cfg.ray_address, cfg.workers or None)
        encoder = PrecomputedEncoder(cfg, read_encoded(out), sources, workers)
        return ingest(cfg, progress, sink=sink, sources=sources, one_chunk=True, encoder=encoder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
