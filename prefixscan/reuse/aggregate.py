"""Aggregates of the per-request reuse columns: the three hit-rate definitions, by group and overall.

Definitions (docs/definitions.md, 'Hit rates'): token-weighted = sum(cached)/sum(prompt), what vLLM's
counters show; block-weighted = hit blocks / all blocks; request mean = mean of per-request block hit
fractions (AIPerf's "theoretical hit rate"); steady state = the same over the second half of the log.
Sums are exact (integers, and the fractions as exact partial sums), so a log analysed whole or streamed in
chunks gives the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl
from numba import njit

PCTS = (50, 90, 99)


_PARTIALS = 64  # Shewchuk partials per group; hit fractions lie in [0, 1], which needs about 22


@njit(cache=True, nogil=True)
def _group_sums(codes, n_groups, prompt, cached, hit, blocks):  # pragma: no cover - compiled
    """Per group: [requests, prompt, cached, hit blocks, blocks] (exact int64), and the hit fractions
    hit/max(blocks, 1) summed exactly as non-overlapping partials (Shewchuk, "Adaptive precision
    floating-point arithmetic", 1997), so the mean does not depend on the order or chunking of the rows."""
    ints = np.zeros((n_groups, 5), np.int64)
    parts = np.zeros((n_groups, _PARTIALS), np.float64)
    nparts = np.zeros(n_groups, np.int64)
    for i in range(len(codes)):
        g = codes[i]
        ints[g, 0] += 1
        ints[g, 1] += prompt[i]
        ints[g, 2] += cached[i]
        ints[g, 3] += hit[i]
        ints[g, 4] += blocks[i]
        x = hit[i] / max(blocks[i], 1)
        k = 0
        for j in range(nparts[g]):
            y = parts[g, j]
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo != 0.0:
                parts[g, k] = lo
                k += 1
            x = hi
        if k >= _PARTIALS:
            raise ValueError("too many partials")
        parts[g, k] = x
        nparts[g] = k + 1
    return ints, parts, nparts


def _sums(df: pl.DataFrame, codes: np.ndarray, n_groups: int) -> tuple[np.ndarray, list[float]]:
    """(int sums per group, request mean per group) of the rows of `df` under `codes`."""
    col = lambda c: np.ascontiguousarray(df[c].to_numpy(), dtype=np.int64)  # noqa: E731
    ints, parts, nparts = _group_sums(np.ascontiguousarray(codes, dtype=np.int32), n_groups, col("prompt_tokens"),
                                      col("cached_tokens"), col("_hit_blocks"), col("_blocks"))
    # fsum of the partials is the correctly rounded sum of every fraction
    means = [math.fsum(parts[g, :nparts[g]]) / ints[g, 0] if ints[g, 0] else 0.0 for g in range(n_groups)]
    return ints, means


def rates(df: pl.DataFrame) -> dict[str, float]:
    """The three hit rates of a set of requests (0 when it holds no tokens)."""
    ints, means = _sums(df, np.zeros(df.height, np.int32), 1)
    _, prompt, cached, hit_blocks, blocks = (int(v) for v in ints[0])
    return {
        "token_weighted": cached / prompt if prompt else 0.0,
        "block_weighted": hit_blocks / blocks if blocks else 0.0,
        "request_mean": means[0],
    }


def percentiles(values: np.ndarray) -> dict[str, float]:
    if len(values) == 0:
        return {"mean": 0.0, "max": 0.0, **{f"p{p}": 0.0 for p in PCTS}}
    return {"mean": float(values.mean()), "max": float(values.max()),
            **{f"p{p}": float(np.percentile(values, p)) for p in PCTS}}


NONE_KEY = "(none)"


def group_summary(df: pl.DataFrame, key: str) -> pl.DataFrame:
    """Requests, tokens and the three hit rates per value of `key` (nulls grouped as "(none)")."""
    values = df[key].cast(pl.String)
    names = values.drop_nulls().unique().sort().to_list()
    if values.null_count() and NONE_KEY not in names:
        names.append(NONE_KEY)
    index = {k: i for i, k in enumerate(names)}
    if values.null_count() == len(values):  # every request "(none)" (a trace's tenant): no strings to map
        codes = np.zeros(len(values), np.int32)
    else:
        codes = values.fill_null(NONE_KEY).replace_strict(index, return_dtype=pl.Int32).to_numpy()
    ints, means = _sums(df, codes, len(names))
    g = pl.DataFrame({
        "_key": pl.Series(names, dtype=pl.String), "requests": ints[:, 0], "prompt_tokens": ints[:, 1],
        "cached_tokens": ints[:, 2], "hit_blocks": ints[:, 3], "blocks": ints[:, 4],
        "request_mean": pl.Series(means, dtype=pl.Float64)})
    return g.with_columns(
        (pl.col("cached_tokens") / pl.col("prompt_tokens").clip(lower_bound=1)).alias("token_weighted"),
        (pl.col("hit_blocks") / pl.col("blocks").clip(lower_bound=1)).alias("block_weighted"),
    ).sort(["cached_tokens", "_key"], descending=[True, False])


# The summaries table's columns after (dimension, key), and their types.
SUMMARY_COLUMNS = {"requests": pl.Int64, "prompt_tokens": pl.Int64, "cached_tokens": pl.Int64,
                   "token_weighted": pl.Float64, "block_weighted": pl.Float64, "request_mean": pl.Float64}


def steady_state(df: pl.DataFrame) -> pl.DataFrame:
    """The second half of the log: rows in analysis order, seq = row index (a view, not a copy)."""
    return df.slice(df.height // 2)


def summaries_table(df: pl.DataFrame, keys: dict[str, str],
                    column: Callable[[str], pl.Series] | None = None) -> pl.DataFrame:
    """One long table: dimension, key, requests, tokens and rates; 'all' and 'steady_state' included.

    With `column`, each dimension's column is fetched when its turn comes and dropped after (a streamed
    log reads them back one at a time instead of holding them all)."""
    parts = []
    for dim, frame in (("all", df), ("steady_state", steady_state(df))):
        r = rates(frame)
        parts.append(pl.DataFrame({
            "dimension": [dim], "key": [dim], "requests": [frame.height],
            "prompt_tokens": [int(frame["prompt_tokens"].sum()) if frame.height else 0],
            "cached_tokens": [int(frame["cached_tokens"].sum()) if frame.height else 0],
            "token_weighted": [r["token_weighted"]], "block_weighted": [r["block_weighted"]],
            "request_mean": [r["request_mean"]],
        }))
    for dim, col in keys.items():
        g = group_summary(df if column is None else df.with_columns(column(col).alias(col)), col)
        parts.append(g.select(pl.lit(dim).alias("dimension"), pl.col("_key").alias("key"), *SUMMARY_COLUMNS))
    schema = {"dimension": pl.String, "key": pl.String, **SUMMARY_COLUMNS}
    return pl.concat([p.cast(schema) for p in parts]) if parts else pl.DataFrame(schema=schema)  # type: ignore[arg-type]  # polars wants a Mapping keyed by its own key union


def by_dimension(summaries: pl.DataFrame, dim: str, limit: int | None = None) -> dict[str, Any]:
    """The JSON form of one dimension of the summaries table."""
    rows = summaries.filter(pl.col("dimension") == dim)
    if limit is not None:
        rows = rows.head(limit)
    return {r["key"]: {c: r[c] for c in SUMMARY_COLUMNS} for r in rows.iter_rows(named=True)}
