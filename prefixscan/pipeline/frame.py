"""The requests table's input columns, in analysis order, and the table itself (REQUESTS_SCHEMA).

`input_frame` puts a Batch's requests in analysis order (time, then input order) with the table's input
columns; `requests_arrow` makes table rows of frame rows and their block-hash lists. The reuse stage
calls both for every chunk, whether the log is one chunk or many.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from prefixscan.config import AnalyzeConfig
from prefixscan.privacy import identity_hasher
from prefixscan.read.latency import COLUMNS as LATENCY_COLS
from prefixscan.read.trace_columns import permute_csr
from prefixscan.schema import REQUESTS_SCHEMA

STRING_COLS = ("tenant", "conversation_id", "user", "model", "adapter", "cache_salt", "replica", "category")


def _hash_names(frame: pl.DataFrame, digest: Callable[[str | None], str | None]) -> pl.DataFrame:
    return frame.with_columns(*[pl.Series(c, [digest(t) for t in frame[c].to_list()], dtype=pl.String)
                                for c in ("tenant", "user") if c in frame.columns])


def input_frame(cfg: AnalyzeConfig, ing: Any) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, list[str], Any,
                                                       np.ndarray]:
    """(input columns, CSR offsets, block hashes, snippets, per-request (hashes, tokens) for token
    granularity, the permutation from input order) of the ingested requests in analysis order. Takes the requests out of
    `ing` (its lists are released)."""
    if ing.frame is not None:  # hashed traces: arrays all the way
        frame, offsets, flat, snippets = ing.frame, ing.offsets, ing.flat, ing.snippets
        ing.frame, ing.offsets, ing.flat, ing.snippets = None, None, None, []
        n = frame.height
        ts = frame["timestamp_s"].to_numpy()
        order = analysis_order(ts)
        if n and not bool((order == np.arange(n)).all()):
            frame = frame[order]
            offsets, flat = permute_csr(offsets, flat, order)
        digest = identity_hasher(cfg)
        if digest is not None:
            frame = _hash_names(frame, digest)
        if "conversation_inferred" not in frame.columns:  # traces carry ids (bailian) or none: never inferred
            frame = frame.with_columns(pl.lit(False).alias("conversation_inferred"))
        return _typed(frame), offsets, flat, snippets, None, order
    cols = ing.cols
    n = len(cols["request_id"])
    ts = np.asarray(cols["timestamp_s"], dtype=np.float64)
    order = analysis_order(ts)
    tenants = cols["tenant"]
    digest = identity_hasher(cfg)
    if digest is not None:
        tenants = [digest(t) for t in tenants]
        cols["user"] = [digest(u) for u in cols["user"]]
    if n and bool((order == np.arange(n)).all()):  # logs are usually in time order already: no copies
        data = {c: v for c, v in cols.items() if c != "tenant"}
        data["tenant"] = tenants
        hashes, snippets, tokens = ing.hashes, ing.snippets, ing.tokens
    else:
        data = {c: [v[i] for i in order] for c, v in cols.items() if c != "tenant"}
        data["tenant"] = [tenants[i] for i in order]
        hashes = [ing.hashes[i] for i in order]
        snippets = [ing.snippets[i] for i in order]
        tokens = [ing.tokens[i] for i in order] if ing.tokens is not None else None
    # The per-request Python lists are not needed once the frame below exists: let them go.
    ing.cols, ing.hashes, ing.snippets, ing.tokens = {}, [], [], None
    lengths = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(hashes) if n else np.zeros(0, np.uint64)
    # only token granularity needs each request's hashes and tokens again
    per_request = (hashes, tokens) if cfg.granularity == "token" else None
    frame = pl.DataFrame({
        "request_id": pl.Series("request_id", data["request_id"], dtype=pl.String),
        "source_file": pl.Series("source_file", data["source_file"], dtype=pl.String),
        "source_line": np.asarray(data["source_line"], dtype=np.int64),
        "timestamp_s": ts[order] if n else ts,
        **{c: pl.Series(c, data[c], dtype=pl.String) for c in STRING_COLS},
        "conversation_inferred": pl.Series("conversation_inferred", data["conversation_inferred"], dtype=pl.Boolean),
        "turn_index": pl.Series("turn_index", data["turn_index"], dtype=pl.Int32),
        "prompt_tokens": np.asarray(data["prompt_tokens"], dtype=np.int64),
        "head_tokens": pl.Series("head_tokens", data["head_tokens"], dtype=pl.Int64),
        "output_tokens": pl.Series("output_tokens", data["output_tokens"], dtype=pl.Int64),
        "actual_cached_tokens": pl.Series("actual_cached_tokens", data["actual_cached_tokens"], dtype=pl.Int64),
        **{c: pl.Series(c, data[c], dtype=pl.Float64) for c in LATENCY_COLS},
        "namespace": pl.Series("namespace", data["namespace"], dtype=pl.UInt64),
    })
    return frame, offsets, flat, snippets, per_request, order


def analysis_order(ts: np.ndarray) -> np.ndarray:
    """The permutation into analysis order: time, then input order (`lexsort`); a log already in time
    order (the usual case) is checked in one pass instead of sorted."""
    n = len(ts)
    if n == 0 or bool((ts[1:] >= ts[:-1]).all()):  # NaN compares False: such a log is sorted
        return np.arange(n, dtype=np.int64)
    return np.lexsort((np.arange(n), ts))


def _typed(frame: pl.DataFrame) -> pl.DataFrame:
    """A trace frame with the same column types as a text log's (hashed traces carry no latency: null)."""
    frame = frame.with_columns(*[pl.lit(None, dtype=pl.Float64).alias(c) for c in LATENCY_COLS
                                 if c not in frame.columns])
    return frame.with_columns(
        pl.col("source_line").cast(pl.Int64), pl.col("timestamp_s").cast(pl.Float64),
        *[pl.col(c).cast(pl.String) for c in STRING_COLS], pl.col("turn_index").cast(pl.Int32),
        pl.col("prompt_tokens").cast(pl.Int64), pl.col("head_tokens").cast(pl.Int64),
        pl.col("output_tokens").cast(pl.Int64), pl.col("actual_cached_tokens").cast(pl.Int64),
        pl.col("namespace").cast(pl.UInt64), pl.col("request_id").cast(pl.String),
        pl.col("conversation_inferred").cast(pl.Boolean),
        pl.col("source_file").cast(pl.String), *[pl.col(c).cast(pl.Float64) for c in LATENCY_COLS])


def requests_arrow(df: pl.DataFrame, offsets: np.ndarray, flat: np.ndarray) -> pa.Table:
    """The requests table (REQUESTS_SCHEMA) of frame rows and their block-hash lists."""
    names = [f.name for f in REQUESTS_SCHEMA if f.name != "block_hashes"]
    t = df.select(names).to_arrow()
    lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32) if len(flat) < 2**31 else offsets,
                                              type=pa.int32() if len(flat) < 2**31 else pa.int64()),
                                     pa.array(flat, type=pa.uint64()))
    if not pa.types.is_list(lists.type):
        lists = lists.cast(pa.list_(pa.uint64()))
    t = t.append_column("block_hashes", lists)
    return t.select([f.name for f in REQUESTS_SCHEMA]).cast(REQUESTS_SCHEMA)
