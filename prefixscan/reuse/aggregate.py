"""Aggregates of the per-request reuse columns: the three hit-rate definitions, by group and overall.

Definitions (REFERENCE.md 9, docs/definitions.md): token-weighted = sum(cached)/sum(prompt), what vLLM's
counters show; block-weighted = hit blocks / all blocks; request mean = mean of per-request block hit
fractions (AIPerf's "theoretical hit rate"); steady state = the same over the second half of the log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl

PCTS = (50, 90, 99)


def rates(df: pl.DataFrame) -> dict[str, float]:
    """The three hit rates of a set of requests (0 when it holds no tokens)."""
    prompt = int(df["prompt_tokens"].sum()) if df.height else 0
    cached = int(df["cached_tokens"].sum()) if df.height else 0
    blocks = int(df["_blocks"].sum()) if df.height else 0
    hit_blocks = int(df["_hit_blocks"].sum()) if df.height else 0
    frac = (df["_hit_blocks"] / df["_blocks"].clip(lower_bound=1)).mean() if df.height else 0.0
    return {
        "token_weighted": cached / prompt if prompt else 0.0,
        "block_weighted": hit_blocks / blocks if blocks else 0.0,
        "request_mean": float(frac or 0.0),
    }


def percentiles(values: np.ndarray) -> dict[str, float]:
    if len(values) == 0:
        return {"mean": 0.0, "max": 0.0, **{f"p{p}": 0.0 for p in PCTS}}
    return {"mean": float(values.mean()), "max": float(values.max()),
            **{f"p{p}": float(np.percentile(values, p)) for p in PCTS}}


def group_summary(df: pl.DataFrame, key: str) -> pl.DataFrame:
    """Requests, tokens and the three hit rates per value of `key` (nulls grouped as "(none)")."""
    g = (
        df.with_columns(pl.col(key).cast(pl.String).fill_null("(none)").alias("_key"))
        .group_by("_key")
        .agg(
            pl.len().alias("requests"),
            pl.col("prompt_tokens").sum().alias("prompt_tokens"),
            pl.col("cached_tokens").sum().alias("cached_tokens"),
            pl.col("_hit_blocks").sum().alias("hit_blocks"),
            pl.col("_blocks").sum().alias("blocks"),
            (pl.col("_hit_blocks") / pl.col("_blocks").clip(lower_bound=1)).mean().alias("request_mean"),
        )
        .with_columns(
            (pl.col("cached_tokens") / pl.col("prompt_tokens").clip(lower_bound=1)).alias("token_weighted"),
            (pl.col("hit_blocks") / pl.col("blocks").clip(lower_bound=1)).alias("block_weighted"),
        )
        .sort(["cached_tokens", "_key"], descending=[True, False])
    )
    return g


def summaries_table(df: pl.DataFrame, keys: dict[str, str],
                    column: Callable[[str], pl.Series] | None = None) -> pl.DataFrame:
    """One long table: dimension, key, requests, tokens and rates; 'all' and 'steady_state' included.

    With `column`, each dimension's column is fetched when its turn comes and dropped after (a streamed
    log reads them back one at a time instead of holding them all)."""
    parts = []
    n = df.height
    for dim, frame in (("all", df), ("steady_state", df.filter(pl.col("seq") >= n // 2))):
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
        parts.append(g.select(
            pl.lit(dim).alias("dimension"), pl.col("_key").alias("key"), "requests", "prompt_tokens",
            "cached_tokens", "token_weighted", "block_weighted", "request_mean"))
    schema = {"dimension": pl.String, "key": pl.String, "requests": pl.Int64, "prompt_tokens": pl.Int64,
              "cached_tokens": pl.Int64, "token_weighted": pl.Float64, "block_weighted": pl.Float64,
              "request_mean": pl.Float64}
    return pl.concat([p.cast(schema) for p in parts]) if parts else pl.DataFrame(schema=schema)


def by_dimension(summaries: pl.DataFrame, dim: str, limit: int | None = None) -> dict[str, Any]:
    """The JSON form of one dimension of the summaries table."""
    rows = summaries.filter(pl.col("dimension") == dim)
    if limit is not None:
        rows = rows.head(limit)
    return {r["key"]: {"requests": r["requests"], "prompt_tokens": r["prompt_tokens"],
                       "cached_tokens": r["cached_tokens"], "token_weighted": r["token_weighted"],
                       "block_weighted": r["block_weighted"], "request_mean": r["request_mean"]}
            for r in rows.iter_rows(named=True)}
