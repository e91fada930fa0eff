"""Ideal-cache reuse as SQL: a group-by and joins over block references, exact, out of core.

A request's ideal-cache hit is the count of its LEADING blocks already seen at an earlier analysis
position (hashes chain, so the seen set is prefix-closed: the first new block ends the run). That is

  first_seen(scope, hash) = min(position)                     -- a group-by on (scope key, hash)
  k(request)             = min(block index whose first_seen is the request itself), else all its blocks

per scope: the whole log, the same tenant, the same conversation (requests without one are left out of
that scope, as `reuse.ideal` does). The source request (most recent earlier holder of the deepest matched
block) is a lag over the same (hash) partitions. Scopes are composite keys (tenant, hash) rather than
`reuse.ideal`'s hash xor salt: equal except on a 64-bit salt collision, and plain SQL on any engine.

The SQL reads two relations, `reqs(pos, n_blocks, prompt_tokens, tenant, conv)` and `blocks(pos, idx, h)`,
which `views_of_requests` builds from a requests table (its `seq` is the analysis position: time, then
input order) and `views_of_parquet` from partitioned Parquet. docs/scale.md shows it running elsewhere.
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

# {B}: block size; {HIT}: the hit rule's token count of k blocks (see HIT_RULES).
REUSE_SQL = """
WITH refs AS (
  SELECT b.pos, b.idx, b.h, r.tenant, r.conv FROM blocks b JOIN reqs r USING (pos)
),
first_all AS (SELECT h, min(pos) AS first_pos FROM refs GROUP BY h),
first_ten AS (SELECT tenant, h, min(pos) AS first_pos FROM refs GROUP BY tenant, h),
first_conv AS (SELECT conv, h, min(pos) AS first_pos FROM refs WHERE conv IS NOT NULL GROUP BY conv, h),
stop_all AS (
  SELECT r.pos, min(r.idx) AS k FROM refs r JOIN first_all f ON f.h = r.h
  WHERE f.first_pos = r.pos GROUP BY r.pos),
stop_ten AS (
  SELECT r.pos, min(r.idx) AS k FROM refs r
  JOIN first_ten f ON f.h = r.h AND f.tenant IS NOT DISTINCT FROM r.tenant
  WHERE f.first_pos = r.pos GROUP BY r.pos),
stop_conv AS (
  SELECT r.pos, min(r.idx) AS k FROM refs r JOIN first_conv f ON f.h = r.h AND f.conv = r.conv
  WHERE f.first_pos = r.pos GROUP BY r.pos),
runs AS (
  SELECT q.pos, q.prompt_tokens AS n,
         coalesce(a.k, q.n_blocks) AS k_all,
         coalesce(t.k, q.n_blocks) AS k_ten,
         CASE WHEN q.conv IS NULL THEN 0 ELSE coalesce(c.k, q.n_blocks) END AS k_conv
  FROM reqs q LEFT JOIN stop_all a USING (pos) LEFT JOIN stop_ten t USING (pos) LEFT JOIN stop_conv c USING (pos)
),
occ AS (
  SELECT h, pos, lag(pos) OVER (PARTITION BY h ORDER BY pos) AS prev_pos
  FROM (SELECT DISTINCT h, pos FROM refs)
),
src AS (
  SELECT u.pos, o.prev_pos FROM runs u
  JOIN blocks b ON b.pos = u.pos AND b.idx = u.k_all - 1
  JOIN occ o ON o.h = b.h AND o.pos = u.pos
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

# Tokens a hit of k leading blocks saves under each rule (hashing.hit_tokens): vLLM never serves the last
# prompt token from cache (min(k, floor((n-1)/B))*B); a hashed trace's blocks are its own.
HIT_RULES = {
    "vllm": "CASE WHEN {k} > 0 AND u.n > 0 THEN least({k}, (greatest(u.n - 1, 0)) // {B}) * {B} ELSE 0 END",
    "trace": "CASE WHEN {k} > 0 AND u.n > 0 THEN least({k} * {B}, u.n) ELSE 0 END",
}


def reuse_sql(block_size: int, rule: str) -> str:
    """The reuse query for one block size and hit rule (the text docs/scale.md shows)."""
    if rule not in HIT_RULES:
        raise ValueError(f"unknown hit rule {rule!r}")
    if block_size < 1:
        raise ValueError("block size must be >= 1")
    hit = {f"HIT_{s.upper()}": HIT_RULES[rule].format(k=f"u.k_{s}", B=block_size) for s in ("all", "ten", "conv")}
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


def run_reuse(con: Any, block_size: int, rule: str) -> pa.Table:
    """The per-request reuse columns (one row per position, in position order). Each step of the query is
    written to a table of the connection's database file first: a step that several later ones read stays
    on disk instead of in memory, which is what keeps the whole query within `memory_limit`."""
    named, final = steps(reuse_sql(block_size, rule))
    for name, select in named:
        con.execute(f"CREATE OR REPLACE TABLE {name} AS {select}")
    try:
        return con.sql(final).to_arrow_table()
    finally:
        for name, _ in reversed(named):
            con.execute(f"DROP TABLE IF EXISTS {name}")


def reuse_of_requests(requests: pa.Table | str, block_size: int, rule: str, memory_limit: str = "1GB",
                      temp_directory: str | None = None, threads: int | None = None) -> pa.Table:
    """The reuse query over a requests table: recompute a run's ideal-cache columns out of core."""
    with connect(memory_limit, temp_directory, threads) as con:
        views_of_requests(con, requests)
        return run_reuse(con, block_size, rule)


def ideal_result(t: pa.Table, n: int) -> IdealResult:
    """The query's rows as `reuse.ideal.IdealResult` arrays (positions must be 0..n-1)."""
    pos = t.column("pos").to_numpy()
    if len(pos) != n or (n and not np.array_equal(pos, np.arange(n))):
        raise ValueError(f"reuse query returned {len(pos)} rows for {n} requests, or positions with gaps")

    def col(name: str, dtype: Any) -> np.ndarray:
        return np.asarray(t.column(name).to_numpy(), dtype=dtype) if n else np.zeros(0, dtype)

    return IdealResult(cached_blocks=col("cached_blocks", np.int32), cached_tokens=col("cached_tokens", np.int64),
                       divergence_token=col("divergence_token", np.int64),
                       tenant_cached_tokens=col("tenant_cached_tokens", np.int64),
                       conversation_cached_tokens=col("conversation_cached_tokens", np.int64),
                       source=col("source_pos", np.int64))
