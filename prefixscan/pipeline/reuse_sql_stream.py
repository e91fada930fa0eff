"""`analyze --reuse sql`: the reuse stage's ideal-cache columns from the reuse SQL, run ONCE over the whole log.

The scan (`reuse.ideal.IdealStream`) keeps a seen-set that grows with the distinct blocks; the reuse SQL
(`prefixscan.reuse.sql`) is the same computation as a group-by and joins that DuckDB runs out
of core, within a memory limit, spilling to a temporary directory. `SqlRequestStream` is `RequestStream`
with the SQL in place of the scan, in three steps:

1. collect (during the ingest, either engine): `RequestStream.feed` puts the requests in analysis order
   exactly as for the scan (the same hold-back, the same `OutOfOrder`); each chunk the scan would process
   is spilled instead: its input columns (Arrow IPC) and, for the SQL, its `reqs` (position, blocks,
   prompt tokens, tenant and conversation keys) and `blocks` (position, index, hash) as Parquet, with the
   positions the scan gives them;
2. the SQL, once over all the spilled Parquet: every request's reuse columns and every block reference's
   whole-log dense id (`reuse_sql.reuse_to_parquet`), written in analysis order;
3. replay: the spilled chunks, in order, through `RequestStream._process`, whose `ideal` is then a cursor
   over the SQL's results (`distributed.reuse_stage.SqlIdealCursor`), so every table is written by the
   same code as with the scan. Each chunk's spill is deleted once replayed.

Memory: one chunk, DuckDB within its limit, one batch of each result file. Disk: the log's block
references about three times over (spill, DuckDB's tables, the results) while the SQL runs.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan.config import AnalyzeConfig
from prefixscan.errors import EnvError
from prefixscan.pipeline.reuse import RequestStream
from prefixscan.reuse.ideal import NO_SCOPE, scope_salts

_SNIPPET = "__snippet"  # the chunk's snippets, as a column of its spilled frame


def _keys(salts: np.ndarray) -> pa.Array:
    """Scope salts as the SQL's scope keys (0, no scope: null)."""
    return pa.array(salts, type=pa.uint64(), mask=salts == NO_SCOPE)


class SqlRequestStream(RequestStream):
    """A RequestStream whose ideal-cache columns come from one run of the reuse SQL over the whole log."""

    def __init__(self, cfg: AnalyzeConfig, path: Path, spill_dir: str, one_chunk: bool = False) -> None:
        super().__init__(cfg, path, spill_dir, one_chunk)
        self.dir = Path(tempfile.mkdtemp(dir=spill_dir, prefix="reuse-sql."))
        for d in ("frames", "reqs", "blocks"):
            (self.dir / d).mkdir()
        self.chunks = 0
        self.reuse_info = {"engine": "sql", "memory_limit": cfg.reuse_memory_limit,
                           "temp_directory": cfg.reuse_temp_dir}

    def _part(self, kind: str, i: int) -> Path:
        return self.dir / kind / f"part-{i:06d}.{'arrow' if kind == 'frames' else 'parquet'}"

    def _process(self, inp: pl.DataFrame, offsets: np.ndarray, flat: np.ndarray, snippets: list[str],
                 per_request: Any = None) -> None:
        """Spill one chunk in analysis order (step 1), with the positions the scan would give it."""
        n = inp.height
        if n == 0:
            return
        if self.seq + n > np.iinfo(np.int32).max:  # the scan's limit too; DENSE_SQL packs pos in 31 bits
            raise OverflowError("a log of 2^31 requests or more: split it and analyse the parts")
        i, self.chunks = self.chunks, self.chunks + 1
        frame = inp.with_columns(pl.Series(_SNIPPET, snippets, dtype=pl.String)) if snippets else inp
        frame.write_ipc(self._part("frames", i))
        off = np.asarray(offsets, dtype=np.int64)
        lengths = np.diff(off)
        pos = np.arange(self.seq, self.seq + n, dtype=np.int64)
        pq.write_table(pa.table({
            "pos": pos, "n_blocks": lengths, "prompt_tokens": inp["prompt_tokens"].to_numpy().astype(np.int64),
            "tenant": _keys(scope_salts(inp["tenant"])), "conv": _keys(scope_salts(inp["conversation_id"]))}),
            self._part("reqs", i))
        refs = int(off[-1] - off[0])
        pq.write_table(pa.table({
            "pos": np.repeat(pos, lengths),
            "idx": (np.arange(refs, dtype=np.int64) - np.repeat(off[:-1] - off[0], lengths)).astype(np.int32),
            "h": pa.array(np.ascontiguousarray(flat[off[0]:off[-1]], dtype=np.uint64), type=pa.uint64())}),
            self._part("blocks", i))
        self.seq += n
        self.written_max_ts = float(inp["timestamp_s"][-1])

    def close(self, wait: bool = True) -> None:
        """Spill the held-back rows, run the SQL once (step 2), then write every table from it (step 3)."""
        self.drain()
        if self.chunks:
            self._sql()
            self._replay()
        self.out.close(wait=wait)

    def _sql(self) -> None:
        import duckdb

        from prefixscan.reuse.sql import SqlIdealCursor, connect, reuse_to_parquet, views_of_parquet

        t = time.perf_counter()
        try:
            with connect(self.cfg.reuse_memory_limit, self.cfg.reuse_temp_dir or str(self.dir),
                         self.cfg.threads) as con:
                views_of_parquet(con, str(self.dir / "reqs"), str(self.dir / "blocks"))
                n_distinct = reuse_to_parquet(con, self.block, self.rule, str(self.dir))
        except duckdb.OutOfMemoryException as exc:
            raise EnvError(f"the reuse SQL ran out of memory within --reuse-memory-limit "
                           f"{self.cfg.reuse_memory_limit}: raise it ({str(exc).splitlines()[0]})") from None
        except (duckdb.IOException, OSError) as exc:
            raise EnvError(f"the reuse SQL could not write its temporary files: {str(exc).splitlines()[0]}") from None
        self.reuse_info["sql_s"] = round(time.perf_counter() - t, 3)
        self.ideal = SqlIdealCursor(str(self.dir / "reuse.parquet"), str(self.dir / "ids.parquet"), n_distinct)

    def _replay(self) -> None:
        """Each spilled chunk, in order, through the scan's own row-writing code, with the SQL's columns."""
        self.seq = 0
        for i in range(self.chunks):
            frame = pl.read_ipc(self._part("frames", i))
            snippets = frame[_SNIPPET].to_list() if _SNIPPET in frame.columns else []
            frame = frame.drop(_SNIPPET, strict=False)
            lengths = pq.read_table(self._part("reqs", i), columns=["n_blocks"]).column("n_blocks").to_numpy()
            offsets = np.zeros(len(lengths) + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            flat = pq.read_table(self._part("blocks", i), columns=["h"]).column("h").to_numpy()
            RequestStream._process(self, frame, offsets, flat.astype(np.uint64, copy=False), snippets)
            for kind in ("frames", "reqs", "blocks"):
                self._part(kind, i).unlink()
