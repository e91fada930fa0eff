"""KV evictions and the age of evicted prefixes, by warm, partial and cold request (seed 002's fourth metric
group), from a recording of the engine's KV events (`analyze --kv-events`).

An eviction is one block hash of a `BlockRemoved` event, aged from the hash's last `BlockStored` before it
(the engine's clock); a request met one when the last event of one of its blocks before its `timestamp_s`
is a removal. docs/pilot.md, "KV evictions by class".
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from prefixscan.pilot.latency import CLASSES, COLUMNS, PCTS, PILOT_SCHEMA, UNKNOWN, class_frame, group_row, percentile
from prefixscan.run.load import Run


def events_by_hash(events: pa.Table) -> pl.DataFrame:
    """One row per block hash of each store or removal, in event order: `hash`, `ts`, `removed`, `_id` (one
    per removal row) and `age_s` (removals only; null without a prior store)."""
    ev: pl.DataFrame = pl.from_arrow(events.select(["seq", "index", "ts", "kind", "block_hashes"]))  # type: ignore[assignment]  # from_arrow(Table): a DataFrame
    ev = ev.filter(pl.col("kind").is_in(["BlockStored", "BlockRemoved"])).with_row_index("_event")
    flat = (ev.explode("block_hashes").drop_nulls("block_hashes").rename({"block_hashes": "hash"})
            .with_columns(pl.col("hash").cast(pl.UInt64), removed=pl.col("kind") == "BlockRemoved")
            .with_row_index("_id"))
    flat = flat.sort("hash", "seq", "index", "_event").with_columns(
        pl.when(~pl.col("removed")).then(pl.col("ts")).otherwise(None).forward_fill().over("hash").alias("_stored"))
    return flat.with_columns(age_s=pl.when(pl.col("removed")).then(pl.col("ts") - pl.col("_stored")))


def _ages(g: pl.DataFrame) -> dict[str, Any]:
    ages = g["age_s"].drop_nulls().to_numpy()
    return {f"evicted_age_p{p}_s": percentile(ages, p) for p in PCTS}


def met(frame: pl.DataFrame, flat: pl.DataFrame) -> pl.DataFrame:
    """(request, removal) pairs: a request and an eviction of one of its blocks that it met."""
    held = (frame.with_row_index("_req").select("_req", "_class", "timestamp_s", "block_hashes")
            .explode("block_hashes").drop_nulls("block_hashes")
            .with_columns(pl.col("block_hashes").cast(pl.UInt64).alias("hash")).drop("block_hashes")
            .sort("timestamp_s"))
    last = flat.select("hash", "ts", "removed", "_id", "age_s").sort("ts")
    j = held.join_asof(last, left_on="timestamp_s", right_on="ts", by="hash", strategy="backward",
                       allow_exact_matches=False, check_sortedness=False)  # both sorted by time above
    return j.filter(pl.col("removed").fill_null(False))


def by_class(run: Run, events: pa.Table, block: int) -> tuple[pa.Table, dict[str, Any]]:
    """(the pilot table's eviction rows, the evidence's `evictions` section)."""
    flat = events_by_hash(events)
    rem = flat.filter(pl.col("removed"))
    req: pl.DataFrame = pl.from_arrow(run.table("requests").select([*COLUMNS, "timestamp_s", "block_hashes"]))  # type: ignore[assignment]  # likewise
    frame, source = class_frame(req, block, keep=("timestamp_s", "block_hashes"))
    pairs = met(frame, flat)
    whole = {"requests": frame.height, "evicted_requests": pairs["_req"].n_unique(), "evicted_blocks": rem.height,
             "aged_blocks": int(rem["age_s"].is_not_null().sum()), **_ages(rem)}
    rows = [{**group_row(frame, "eviction_all"), **{k: whole[k] for k in ("evicted_requests", "evicted_blocks")},
             **_ages(rem)}]
    classes: dict[str, Any] = {}
    for i, name in enumerate((*CLASSES, UNKNOWN)):
        mine = frame.filter(pl.col("_class") == i)
        if not mine.height and name not in CLASSES:
            continue
        h = pairs.filter(pl.col("_class") == i)
        once = h.unique("_id")  # a removal counts once per class, however many of its requests met it
        row = {**group_row(mine, "eviction", cls=name), "evicted_requests": h["_req"].n_unique(),
               "evicted_blocks": once.height, **_ages(once)}
        rows.append(row)
        classes[name] = {k: row[k] for k in ("requests", "evicted_requests", "evicted_blocks", "evicted_age_p50_s",
                                             "evicted_age_p95_s")}
    info = {"cached_source": source, "age": "removal ts minus the block's most recent BlockStored ts before it "
                                           "(the engine's event clock)",
            "met": "the last event of one of the request's blocks before its timestamp_s is a removal",
            "all": whole, "by_class": classes}
    return pa.Table.from_pylist(rows, schema=PILOT_SCHEMA), info
