"""Top shared prefixes: hits grouped by the deepest block they matched, ranked by prefill saved."""

from __future__ import annotations

import numpy as np
import polars as pl

from prefixscan.redact import redact_snippet

TOP = 1000


def prefixes_table(req: pl.DataFrame, deepest: np.ndarray, snippets: list[str], top: int = TOP,
                   include_text: bool = False) -> pl.DataFrame:
    """One row per shared prefix (the deepest matched block hash) among requests that hit.

    `tokens_saved` is the prefill the ideal cache avoids through that prefix; `tenants` counts distinct
    tenants that hit it, and `cross_tenant_hits` the hits that only another tenant's request could serve.
    Snippets are redacted and truncated unless the user asked for text (`--include-text`); an empty
    `snippets` list means the log has no text (hashed traces).
    """
    src_idx = req["_source"].to_numpy()
    df = req.select(*ROW_COLUMNS).with_columns(
        pl.Series("prefix_hash", deepest, dtype=pl.UInt64),
        (pl.Series("_snippet", snippets, dtype=pl.String).gather(np.maximum(src_idx, 0))
         .set(pl.Series(src_idx < 0), "") if snippets else pl.lit("", dtype=pl.String).alias("_snippet")),
    ).filter(pl.col("cached_blocks") > 0)
    if df.height == 0:
        return _empty()
    keep = top_prefix_hashes(df["prefix_hash"].to_numpy(), df["cached_tokens"].to_numpy(), top)
    return aggregate_prefixes(df.join(keep.to_frame(), on="prefix_hash", how="semi"), top, include_text)


ROW_COLUMNS = ("seq", "tenant", "arrival_s", "cached_tokens", "tenant_cached_tokens", "cached_blocks", "request_id")


def top_prefix_hashes(prefix_hash: np.ndarray, cached_tokens: np.ndarray, top: int = TOP) -> pl.Series:
    """The `top` prefixes by tokens saved, over the requests that hit (one prefix hash and hit each).

    Ranking first on the cheap sum, then aggregating only the rows of the top prefixes: the per-group
    median of reuse gaps over every distinct prefix cost more than the rest of the table. A streamed log
    also reads the other columns back only for these rows."""
    g = (pl.DataFrame({"prefix_hash": pl.Series(prefix_hash, dtype=pl.UInt64), "cached_tokens": cached_tokens})
         .group_by("prefix_hash").agg(pl.col("cached_tokens").sum().alias("tokens_saved"))
         .sort(["tokens_saved", "prefix_hash"], descending=[True, False]).head(top))
    return g["prefix_hash"]


def aggregate_prefixes(df: pl.DataFrame, top: int = TOP, include_text: bool = False) -> pl.DataFrame:
    """The table from the hit rows of the top prefixes: ROW_COLUMNS plus `prefix_hash` and the source's
    `_snippet`, in any order."""
    if df.height == 0:
        return _empty()
    g = (
        df.sort("seq")
        .group_by("prefix_hash")
        .agg(
            pl.col("cached_tokens").max().alias("prefix_tokens"),
            pl.len().alias("hits"),
            pl.col("cached_tokens").sum().alias("tokens_saved"),
            pl.col("tenant").n_unique().alias("tenants"),
            (pl.col("cached_tokens") > pl.col("tenant_cached_tokens")).sum().alias("cross_tenant_hits"),
            pl.col("arrival_s").min().alias("first_hit_s"),
            pl.col("arrival_s").max().alias("last_hit_s"),
            pl.col("arrival_s").diff().median().alias("median_reuse_gap_s"),
            pl.col("request_id").first().alias("first_hit_request_id"),
            pl.col("_snippet").first().alias("snippet"),
        )
        .sort(["tokens_saved", "prefix_hash"], descending=[True, False])
        .head(top)
        .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("rank"))
    )
    shown = [(s or "")[:96] if include_text else redact_snippet(s or "", 96) for s in g["snippet"].to_list()]
    g = g.with_columns(pl.Series("snippet", shown, dtype=pl.String))
    return g.select("rank", "prefix_hash", "prefix_tokens", "hits", "tokens_saved", "tenants",
                    "cross_tenant_hits", "first_hit_s", "last_hit_s", "median_reuse_gap_s",
                    "first_hit_request_id", "snippet")


def _empty() -> pl.DataFrame:
    return pl.DataFrame(schema={
        "rank": pl.Int64, "prefix_hash": pl.UInt64, "prefix_tokens": pl.Int64, "hits": pl.UInt32,
        "tokens_saved": pl.Int64, "tenants": pl.UInt32, "cross_tenant_hits": pl.UInt32,
        "first_hit_s": pl.Float64, "last_hit_s": pl.Float64, "median_reuse_gap_s": pl.Float64,
        "first_hit_request_id": pl.String, "snippet": pl.String})
