"""The reuse SQL in place of the pipeline's reuse scan (`reuse.ideal.IdealStream`).

`SqlIdealCursor` has `IdealStream.add`'s interface: a chunk's block-hash CSR, prompt tokens and the tenant and
conversation salts in; the same IdealResult and whole-log dense block ids out. It is what `analyze --reuse sql`
uses (`pipeline/reuse_sql_stream.py`): the query has run ONCE over the whole log
(`reuse_sql.reuse_to_parquet`), and each `add` reads the next chunk's rows from its result files, checking
they fit. (The per-chunk proof that the SQL is the reuse stage, running the query over every chunk so far, is
the test oracle `tests/oracles/sql_ideal_ref.py`.)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan.reuse.ideal import IdealResult
from prefixscan.reuse.sql import ideal_result


class _Rows:
    """A Parquet file read forward in runs of exactly the rows asked for (one batch buffered)."""

    def __init__(self, path: str) -> None:
        self.file = pq.ParquetFile(path)
        self.batches = self.file.iter_batches(batch_size=1 << 16)
        self.buf: list[pa.RecordBatch] = []
        self.have = 0

    def take(self, k: int) -> pa.Table:
        while self.have < k:
            b = next(self.batches, None)
            if b is None:
                raise ValueError(f"the reuse SQL's {self.file.metadata.num_rows} rows end before the log does")
            self.buf.append(b)
            self.have += b.num_rows
        t = pa.Table.from_batches(self.buf, schema=self.file.schema_arrow)
        self.buf, self.have = t.slice(k).to_batches(), self.have - k
        return t.slice(0, k)

    def close(self) -> None:
        self.file.close()


class SqlIdealCursor:
    """`IdealStream`'s interface over the reuse SQL's results for the WHOLE log (`reuse_sql.reuse_to_parquet`,
    run once): each `add` takes the next chunk's rows and dense ids from the two files, in analysis order.

    The chunks must come in the order and sizes whose positions the SQL was given; each is checked: its
    positions, its block references per request, and that no hit is longer than the request."""

    def __init__(self, reuse_path: str, ids_path: str, n_distinct: int) -> None:
        self.rows, self.ids = _Rows(reuse_path), _Rows(ids_path)
        self._distinct = n_distinct
        self.n = 0

    @property
    def n_distinct(self) -> int:
        return self._distinct

    def release(self) -> None:
        """Close the result files."""
        self.rows.close()
        self.ids.close()

    def add(self, offsets: np.ndarray, hashes: np.ndarray, prompt_tokens: np.ndarray, block_size: int, rule: str,
            tenant_salts: np.ndarray, conversation_salts: np.ndarray) -> tuple[IdealResult, np.ndarray]:
        """The next chunk's IdealResult (`source` in whole-log indices) and whole-log dense ids."""
        n = len(prompt_tokens)
        lengths: np.ndarray = np.diff(np.asarray(offsets, dtype=np.int64))
        res = ideal_result(self.rows.take(n), n, self.n)
        ids = self.ids.take(int(lengths.sum()))
        pos = ids.column("pos").to_numpy()
        if not np.array_equal(pos, np.repeat(np.arange(self.n, self.n + n), lengths)) or (
                n and bool((res.cached_blocks > lengths).any())):
            raise ValueError(f"the reuse SQL's rows do not fit the requests at positions {self.n}..{self.n + n - 1}")
        self.n += n
        return res, ids.column("gid").to_numpy().astype(np.int32, copy=False)
