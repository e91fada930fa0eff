"""Ideal-cache reuse as SQL: a group-by and joins over block references, exact, out of core.

A request's ideal-cache hit is the count of its LEADING blocks already seen at an earlier analysis
position (hashes chain, so the seen set is prefix-closed: the first new block ends the run). That is

  first(scope, hash) = min((position, index))     -- a group-by on (scope key, hash)
  k(request)        = min(index of the blocks whose first reference is in the request), else all its blocks
                                                 -- a group-by of the first references on their position

per scope: the whole log, the same tenant, the same conversation (requests without one are left out of
that scope, as `reuse.ideal` does). The source request (most recent earlier holder of the deepest matched
block) is a lag over the (hash) partitions of the deepest blocks. The whole log's `first` ranked is the
scan's dense block numbering (DENSE_SQL), which the capacity curve indexes by. Scopes are composite keys
(tenant, hash) rather than `reuse.ideal`'s hash xor salt: equal except on a 64-bit salt collision, and
plain SQL on any engine.

The SQL reads two relations, `reqs(pos, n_blocks, prompt_tokens, tenant, conv)` and `blocks(pos, idx, h)`,
which `views_of_requests` builds from a requests table (its `seq` is the analysis position: time, then
input order) and `views_of_parquet` from partitioned Parquet. docs/scale.md shows it running elsewhere.

`SqlIdealCursor` puts the reuse SQL in place of the pipeline's reuse scan (`reuse.ideal.IdealStream`),
with `IdealStream.add`'s interface: a chunk's block-hash CSR, prompt tokens and the tenant and conversation
salts in; the same IdealResult and whole-log dense block ids out. It is what `analyze --reuse sql` uses
(`pipeline/reuse_sql_stream.py`): the query has run ONCE over the whole log (`reuse_to_parquet`), and each
`add` reads the next chunk's rows from its result files, checking they fit. (The per-chunk proof that the
SQL is the reuse stage, running the query over every chunk so far, is the test oracle
`tests/oracles/sql_ideal_ref.py`.)
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from prefixscan.reuse.ideal import IdealResult

# {B}: block size; {HIT}: the hit rule's token count of k blocks (see HIT_SQL). A reference's order is
# (pos, idx), packed in one BIGINT key pos * 2^32 + idx (pos < 2^31, idx < 2^32), so one min() gives a
# block's first reference and the request's novel blocks need no second pass over the references.
REUSE_SQL = """
WITH refs AS (
  SELECT b.pos, b.idx, b.h, r.tenant, r.conv FROM blocks b JOIN reqs r USING (pos)
),
first_all AS (SELECT h, min(pos * 4294967296 + idx) AS first_key FROM refs GROUP BY h),
first_ten AS (SELECT min(pos * 4294967296 + idx) AS first_key FROM refs GROUP BY tenant, h),
first_conv AS (
  SELECT min(pos * 4294967296 + idx) AS first_key FROM refs WHERE conv IS NOT NULL GROUP BY conv, h),
stops AS (
  SELECT first_key // 4294967296 AS pos,
         min(CASE WHEN scope = 0 THEN first_key % 4294967296 END) AS k_all,
         min(CASE WHEN scope = 1 THEN first_key % 4294967296 END) AS k_ten,
         min(CASE WHEN scope = 2 THEN first_key % 4294967296 END) AS k_conv
  FROM (SELECT 0 AS scope, first_key FROM first_all UNION ALL SELECT 1, first_key FROM first_ten
        UNION ALL SELECT 2, first_key FROM first_conv)
  GROUP BY first_key // 4294967296),
runs AS (
  SELECT q.pos, q.prompt_tokens AS n,
         coalesce(s.k_all, q.n_blocks) AS k_all,
         coalesce(s.k_ten, q.n_blocks) AS k_ten,
         CASE WHEN q.conv IS NULL THEN 0 ELSE coalesce(s.k_conv, q.n_blocks) END AS k_conv
  FROM reqs q LEFT JOIN stops s USING (pos)
),
deepest AS (
  SELECT u.pos, b.h FROM runs u JOIN blocks b ON b.pos = u.pos AND b.idx = u.k_all - 1
),
occ AS (
  SELECT h, pos, lag(pos) OVER (PARTITION BY h ORDER BY pos) AS prev_pos
  FROM (SELECT DISTINCT h, pos FROM refs WHERE h IN (SELECT h FROM deepest))
),
src AS (
  SELECT d.pos, o.prev_pos FROM deepest d JOIN occ o ON o.h = d.h AND o.pos = d.pos
)
SELECT u.pos,
       CAST(u.k_all AS INTEGER) AS cached_blocks,
       {HIT_ALL} AS cached_tokens,
       least(u.k_all * {B}, u.n) AS divergence_token,
       {HIT_TEN} AS tenant_cached_tokens,
       {HIT_CONV} AS conversation_cached_tokens,
       coalesce(s.prev_pos, -1) AS source_pos
FROM runs u LEFT JOIN src s USING (pos)
ORDER BY u.pos
"""

# Tokens a hit of k leading blocks saves under each rule: the SQL form of `hashing.hit_cap_tokens`, the rule's
# one home (tests/test_hitrule.py checks they agree). vLLM never serves the last prompt token from cache
# (min(k, floor((n-1)/B))*B); a hashed trace's blocks are its own.
HIT_SQL = {
    "vllm": "CASE WHEN {k} > 0 AND u.n > 0 THEN least({k}, (greatest(u.n - 1, 0)) // {B}) * {B} ELSE 0 END",
    "trace": "CASE WHEN {k} > 0 AND u.n > 0 THEN least({k} * {B}, u.n) ELSE 0 END",
}


def reuse_sql(block_size: int, rule: str) -> str:
    """The reuse query for one block size and hit rule (the text docs/scale.md shows)."""
    if rule not in HIT_SQL:
        raise ValueError(f"unknown hit rule {rule!r}")
    if block_size < 1:
        raise ValueError("block size must be >= 1")
    hit = {f"HIT_{s.upper()}": HIT_SQL[rule].format(k=f"u.k_{s}", B=block_size) for s in ("all", "ten", "conv")}
    return REUSE_SQL.format(B=block_size, **hit)


@contextmanager
def connect(memory_limit: str = "1GB", temp_directory: str | None = None, threads: int | None = None) -> Iterator[Any]:
    """A DuckDB connection that spills to `temp_directory` past `memory_limit` (a temporary folder if None)."""
    import duckdb

    with tempfile.TemporaryDirectory(prefix="prefixscan-reuse-", dir=temp_directory) as tmp:
        # A database file, not :memory:, so what the query materialises (its shared CTEs) can leave memory
        con = duckdb.connect(str(Path(tmp) / "reuse.duckdb"), config={"autoinstall_known_extensions": False,
                                                                     "autoload_known_extensions": False})
        try:
            con.execute(f"SET memory_limit = '{_size(memory_limit)}'")
            con.execute(f"SET temp_directory = '{_quote(tmp)}'")
            con.execute("SET preserve_insertion_order = false")
            if threads:
                con.execute(f"SET threads = {int(threads)}")
            yield con
        finally:
            con.close()


def _size(s: str) -> str:
    s = str(s).strip()
    if not s or not all(c.isalnum() or c in ". " for c in s):
        raise ValueError(f"not a memory size: {s!r}")
    return s


def _quote(s: str) -> str:
    return s.replace("'", "''")


def views_of_requests(con: Any, requests: pa.Table | str) -> None:
    """`reqs` and `blocks` over a requests table (an Arrow table, or a Parquet file / glob / folder)."""
    if isinstance(requests, pa.Table):
        con.register("_requests", requests)
        src = "_requests"
    else:
        src = f"read_parquet('{_quote(_glob(requests))}')"
    con.execute(f"""CREATE OR REPLACE TEMP VIEW reqs AS
        SELECT seq AS pos, len(block_hashes) AS n_blocks, prompt_tokens, tenant, conversation_id AS conv FROM {src}""")
    con.execute(f"""CREATE OR REPLACE TEMP VIEW blocks AS
        SELECT seq AS pos, unnest(range(len(block_hashes))) AS idx, unnest(block_hashes) AS h FROM {src}""")


def views_of_parquet(con: Any, reqs: str, blocks: str) -> None:
    """`reqs` and `blocks` over partitioned Parquet folders (the Ray engine's output)."""
    con.execute(f"CREATE OR REPLACE TEMP VIEW reqs AS SELECT pos, n_blocks, prompt_tokens, tenant, conv "
                f"FROM read_parquet('{_quote(_glob(reqs))}')")
    con.execute("CREATE OR REPLACE TEMP VIEW blocks AS SELECT pos, idx, h "
                f"FROM read_parquet('{_quote(_glob(blocks))}')")


def _glob(path: str) -> str:
    p = Path(path)
    return str(p / "**" / "*.parquet") if p.is_dir() else str(path)


def steps(sql: str) -> tuple[list[tuple[str, str]], str]:
    """A `WITH a AS (...), b AS (...) SELECT ...` statement as its named steps and the final SELECT."""
    body = sql.strip()
    if not body.upper().startswith("WITH "):
        return [], body
    i, out = 5, []
    while True:
        name_end = body.index(" AS (", i)
        name = body[i:name_end].strip().lstrip(",").strip()
        depth, j = 0, name_end + 4
        while True:
            depth += {"(": 1, ")": -1}.get(body[j], 0)
            if depth == 0:
                break
            j += 1
        out.append((name, body[name_end + 5:j].strip()))
        rest = body[j + 1:].lstrip()
        if not rest.startswith(","):
            return out, rest
        i = j + 1


@contextmanager
def _step_tables(con: Any, sql: str) -> Iterator[str]:
    """Each named step of `sql` written to a table of the connection's database file, dropped afterwards;
    yields the final SELECT. A step that several later ones read stays on disk instead of in memory, which
    is what keeps the whole query within `memory_limit`."""
    named, final = steps(sql)
    made: list[str] = []
    try:
        for name, select in named:
            con.execute(f"CREATE OR REPLACE TABLE {name} AS {select}")
            made.append(name)
        yield final
    finally:
        for name in reversed(made):
            con.execute(f"DROP TABLE IF EXISTS {name}")


def run_reuse(con: Any, block_size: int, rule: str) -> pa.Table:
    """The per-request reuse columns (one row per position, in position order)."""
    with _step_tables(con, reuse_sql(block_size, rule)) as final:
        return con.sql(final).to_arrow_table()


# The scan's dense block ids (`dense.DenseTable`: distinct hashes numbered in order of first appearance):
# a rank of the reuse query's `first_all` (which must still be a table of the connection) by first reference.
DENSE_SQL = """
WITH dense AS (SELECT h, CAST(row_number() OVER (ORDER BY first_key) - 1 AS INTEGER) AS gid FROM first_all)
SELECT b.pos, d.gid FROM blocks b JOIN dense d USING (h)
ORDER BY b.pos, b.idx
"""


def reuse_to_parquet(con: Any, block_size: int, rule: str, out_dir: str) -> int:
    """Run the reuse query and the dense ids ONCE over the connection's `reqs` and `blocks`, each written in
    order to a Parquet file of `out_dir`: `reuse.parquet` (a row per position, as `run_reuse` returns) and
    `ids.parquet` (pos, gid: a row per block reference, in (pos, idx) order). Returns the distinct blocks.
    Every step is a table of the connection's database file first, as in `run_reuse`."""
    out = Path(out_dir)
    con.execute("SET preserve_insertion_order = true")  # COPY writes the ORDER BY's order
    with _step_tables(con, reuse_sql(block_size, rule)) as final:
        con.execute(f"COPY ({final}) TO '{_quote(str(out / 'reuse'))}.parquet' (FORMAT parquet)")
        with _step_tables(con, DENSE_SQL) as dense:  # reads the reuse query's `first_all`
            con.execute(f"COPY ({dense}) TO '{_quote(str(out / 'ids'))}.parquet' (FORMAT parquet)")
        return int(con.execute("SELECT count(*) FROM first_all").fetchone()[0])


def check_memory_limit(memory_limit: str) -> None:
    """A memory limit DuckDB accepts, or ValueError (one line): checked before any long work."""
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        con.execute(f"SET memory_limit = '{_size(memory_limit)}'")
    except duckdb.Error as exc:
        raise ValueError(f"not a memory size: {memory_limit!r} ({str(exc).splitlines()[0]})") from None
    finally:
        con.close()


def check_temp_directory(temp_directory: str) -> None:
    """A directory DuckDB can spill to, or ValueError (one line): checked before any long work."""
    if not Path(temp_directory).is_dir():
        raise ValueError(f"{temp_directory}: not a directory")
    try:
        with tempfile.TemporaryDirectory(prefix="prefixscan-reuse-", dir=temp_directory) as tmp:
            (Path(tmp) / "probe").write_bytes(b"x")
    except OSError as exc:
        raise ValueError(f"{temp_directory}: cannot write there ({exc.strerror or exc})") from None


def reuse_of_requests(requests: pa.Table | str, block_size: int, rule: str, memory_limit: str = "1GB",
                      temp_directory: str | None = None, threads: int | None = None) -> pa.Table:
    """The reuse query over a requests table: recompute a run's ideal-cache columns out of core."""
    with connect(memory_limit, temp_directory, threads) as con:
        views_of_requests(con, requests)
        return run_reuse(con, block_size, rule)


def ideal_result(t: pa.Table, n: int, start: int = 0) -> IdealResult:
    """The query's rows as `reuse.ideal.IdealResult` arrays (positions must be start..start+n-1)."""
    pos = t.column("pos").to_numpy()
    if len(pos) != n or (n and not np.array_equal(pos, np.arange(start, start + n))):
        raise ValueError(f"reuse query returned {len(pos)} rows for {n} requests, or positions with gaps")

    def col(name: str, dtype: Any) -> np.ndarray:
        return np.asarray(t.column(name).to_numpy(), dtype=dtype) if n else np.zeros(0, dtype)

    return IdealResult(cached_blocks=col("cached_blocks", np.int32), cached_tokens=col("cached_tokens", np.int64),
                       divergence_token=col("divergence_token", np.int64),
                       tenant_cached_tokens=col("tenant_cached_tokens", np.int64),
                       conversation_cached_tokens=col("conversation_cached_tokens", np.int64),
                       source=col("source_pos", np.int64))


class _Rows:
    """A Parquet file read forward in runs of exactly the rows asked for (one batch buffered)."""

    def __init__(self, path: str) -> None:
        import pyarrow.parquet as pq

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
