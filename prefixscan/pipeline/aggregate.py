"""Aggregate stage: the requests table (on disk) and the reuse stage's spills -> summaries, prefixes,
the capacity curve and the per-request statistics the summary reads.

The requests table is read back one or a few columns at a time (rows are in analysis order, so the
steady state is a slice), so the aggregates hold a few columns of the log at most.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan import memory
from prefixscan.config import AnalyzeConfig
from prefixscan.encode.hashing import counted_hit_blocks
from prefixscan.pipeline.reuse import RequestStream, turn_bucket
from prefixscan.pipeline.write import writing
from prefixscan.reuse.aggregate import summaries_table
from prefixscan.reuse.prefixes import ROW_COLUMNS, aggregate_prefixes, member, top_prefix_hashes

SUMMARY_DIMENSIONS = {"tenant": "tenant", "model": "model", "prefix_class": "prefix_class",
                      "hit_source": "hit_source", "turn_index": "_turn_bucket", "category": "category"}


@dataclass
class SideStats:
    """What the summary reads from columns beyond the hit-rate ones; a streamed run computes these one
    column at a time instead of holding a frame with all of them."""

    with_conversation: int  # requests that carry a conversation id
    conversations: int  # distinct conversation ids
    gaps: np.ndarray  # seconds from each hit's source request to it
    actual: pl.DataFrame  # rows with an engine-reported value: actual_cached_tokens, cached_tokens,
    # predicted_minus_actual

    @staticmethod
    def conversation_counts(conv: pl.Series) -> tuple[int, int]:
        has = int(conv.is_not_null().sum())
        return has, int(conv.n_unique() - (1 if has < len(conv) else 0)) if len(conv) else 0

    @staticmethod
    def reuse_gaps(arrival: np.ndarray, source: np.ndarray) -> np.ndarray:
        return (arrival - arrival[np.maximum(source, 0)])[source >= 0] if len(arrival) else np.zeros(0)

    @classmethod
    def of(cls, req: pl.DataFrame) -> SideStats:
        has, distinct = cls.conversation_counts(req["conversation_id"])
        return cls(has, distinct, cls.reuse_gaps(req["arrival_s"].to_numpy(), req["_source"].to_numpy()),
                   req.filter(pl.col("actual_cached_tokens").is_not_null()))


def capacity(cfg: AnalyzeConfig, stream: RequestStream, n_distinct: int, block_size: int, hit_rule: str,
             run_path: Path) -> pa.Table:
    """The capacity curve from the reuse stage's spilled per-block input (an empty log: an empty curve)."""
    caps = list(cfg.capacities) if cfg.capacities else None
    if stream.capacity is None:
        from prefixscan.reuse.capacity.lru import capacity_curve

        return capacity_curve(np.zeros(1, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64),
                              block_size, hit_rule, caps)
    with writing(run_path):  # SHARDS when asked (--capacity-sample), or above the size threshold
        return stream.capacity.finish(n_distinct, caps, sample=_sample(cfg, stream))


def capacity_job(cfg: AnalyzeConfig, stream: RequestStream, n_distinct: int) -> Callable[[], pa.Table] | None:
    """`capacity` as a function to call later, when the capacity input is held in memory (a one-chunk log
    whose `WholeCapacity` did not switch to streaming): its arrays are taken now, and the function reads
    no file and nothing of the stream, so it may run in another thread while the aggregates and findings
    run. None when the input streams from spills (`capacity` then, alone: see `run._reuse`)."""
    from prefixscan.reuse.capacity.whole import WholeCapacity

    whole = stream.capacity
    if not isinstance(whole, WholeCapacity) or not whole.held:
        return None
    return whole.take(n_distinct, list(cfg.capacities) if cfg.capacities else None, sample=_sample(cfg, stream))


def _sample(cfg: AnalyzeConfig, stream: RequestStream) -> float | None:
    from prefixscan.reuse.capacity.sampled import auto_rate

    return auto_rate(cfg.capacity_sample, stream.capacity.total_blocks)


def read_columns(path: Path, names: list[str]) -> pl.DataFrame:
    """Columns read by polars itself (through Arrow they would be two copies), each made one contiguous
    chunk in turn, so the read holds the columns plus one column's copy at most."""
    df = pl.read_parquet(path, columns=names)
    return pl.DataFrame([df.drop_in_place(c).rechunk() for c in names])


def aggregates(cfg: AnalyzeConfig, stream: RequestStream, path: Path) -> tuple[pl.DataFrame, Any, pl.DataFrame,
                                                                                  pl.DataFrame]:
    """(the summary's per-request frame, its side statistics, summaries, prefixes) from the written table
    and the kept arrays."""
    source = stream.source.read()
    # Prefixes first, from two columns: their sort and the rows they read back never meet the base frame.
    hits = read_columns(path, ["cached_blocks", "cached_tokens"])
    prefixes = _prefixes(cfg, path, hits, stream.deepest.read(), source, stream.snippets)
    memory.trim()
    # Only the columns the rates read (rows are in analysis order, so the steady state is a slice).
    base = hits.with_columns(read_columns(path, ["prompt_tokens"])["prompt_tokens"],
                             pl.Series("_blocks", stream.blocks.read()))
    del hits
    base = base.with_columns(counted_hit_blocks(pl.col("cached_tokens"), pl.col("cached_blocks").cast(pl.Int64),
                                                stream.block, stream.rule).alias("_hit_blocks")).drop("cached_blocks")

    def column(name: str) -> pl.Series:
        if name == "_turn_bucket":
            return read_columns(path, ["turn_index"]).select(turn_bucket())["_turn_bucket"]
        return read_columns(path, [name])[name]

    summaries = summaries_table(base, SUMMARY_DIMENSIONS, column)
    agg = base.with_columns(read_columns(path, ["tenant_cached_tokens"]))
    side = SideStats(*SideStats.conversation_counts(column("conversation_id")),
                     SideStats.reuse_gaps(column("arrival_s").to_numpy(), source), actual_rows(path))
    return agg, side, summaries, prefixes


def actual_rows(path: Path) -> pl.DataFrame:
    """Rows with an engine-reported cached count, read row group by row group with that filter."""
    import pyarrow.dataset as ds

    cols = ["seq", "request_id", "tenant", "prompt_tokens", "cached_tokens", "actual_cached_tokens",
            "predicted_minus_actual"]
    t = ds.dataset(path, format="parquet").to_table(columns=cols, filter=ds.field("actual_cached_tokens").is_valid())
    return pl.from_arrow(t)  # type: ignore[return-value]


def _prefixes(cfg: AnalyzeConfig, path: Path, hits: pl.DataFrame, deepest: np.ndarray,
              source: np.ndarray, snippets: list[pa.Array]) -> pl.DataFrame:
    """The prefixes table: rank on (deepest block, hit) kept on disk, then read back only the rows of the
    top prefixes (and the ids and snippets of a thousand first hits)."""
    hit = hits["cached_blocks"].to_numpy() > 0
    keep = top_prefix_hashes(deepest[hit], hits["cached_tokens"].to_numpy()[hit])
    rows = np.nonzero(hit & member(deepest, keep))[0]
    if not len(rows):
        return aggregate_prefixes(pl.DataFrame(), list, list)
    df = _rows(path, rows, list(ROW_COLUMNS)).with_columns(pl.Series("prefix_hash", deepest[rows], dtype=pl.UInt64))
    text = pa.chunked_array(snippets) if snippets else None

    def first_ids(seqs: np.ndarray) -> list[str]:
        order = np.argsort(seqs)
        ids = _rows(path, seqs[order], ["request_id"])["request_id"].to_list()
        out = [""] * len(seqs)
        for i, v in zip(order.tolist(), ids, strict=True):
            out[i] = v
        return out

    def first_snippets(seqs: np.ndarray) -> list[str]:
        src = source[seqs]
        if text is None:
            return [""] * len(seqs)
        got = text.take(pa.array(np.maximum(src, 0))).to_pylist()
        return [g if s >= 0 else "" for g, s in zip(got, src.tolist(), strict=True)]

    def own_snippets(seqs: np.ndarray) -> list[str]:
        return text.take(pa.array(seqs)).to_pylist() if text is not None else [""] * len(seqs)

    # No text at all (a hashed trace): every snippet is empty, with no pass over the hit rows to find so.
    return aggregate_prefixes(df, first_ids, first_snippets, include_text=cfg.include_text,
                              own_snippets=own_snippets if text is not None else None, k=cfg.snippet_k)


def _rows(path: Path, rows: np.ndarray, columns: list[str]) -> pl.DataFrame:
    """The given rows (ascending) of some columns, read one row group at a time."""
    pf = pq.ParquetFile(path)
    frames, start = [], 0
    for g in range(pf.num_row_groups):
        size = pf.metadata.row_group(g).num_rows
        sel = rows[(rows >= start) & (rows < start + size)] - start
        if len(sel):
            frames.append(pl.from_arrow(pf.read_row_group(g, columns=columns).take(pa.array(sel))))
        start += size
    return pl.concat(frames)  # type: ignore[type-var,return-value]  # from_arrow(Table): DataFrames
