"""KV evictions and the age of evicted prefixes, by warm, partial and cold request (issue 31, seed 002's
fourth metric group), from a recording of the engine's KV events (`analyze --kv-events`).

An eviction is one block hash of a `BlockRemoved` event. Its **age** is the time from the most recent
`BlockStored` of the same hash before it to the removal, both on the engine's event clock (`ts`), so no
clock of the request log is mixed in; a block removed without a store in the recording has no age. By
class: the run's requests, classed by the pilot rule (prefixscan.pilot), are joined to the removals by
block hash (the same join as `kv_events_join`); a class's evictions are the removals of blocks any of its
requests holds, each removal counted once per class, and its evicted requests those with at least one.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from prefixscan.io.rundir import Run
from prefixscan.pilot import CLASSES, COLUMNS, PILOT_SCHEMA, UNKNOWN, class_frame, group_row, percentile

PCTS = (50, 95)


def removals(events: pa.Table) -> pl.DataFrame:
    """One row per removed block hash: `hash`, `ts` of the removal, `age_s` (null without a prior store)."""
    ev = pl.from_arrow(events.select(["seq", "index", "ts", "kind", "block_hashes"]))
    ev = ev.filter(pl.col("kind").is_in(["BlockStored", "BlockRemoved"])).with_row_index("_order")
    flat = ev.explode("block_hashes").drop_nulls("block_hashes").rename({"block_hashes": "hash"})
    flat = flat.sort("hash", "seq", "index", "_order").with_columns(
        pl.when(pl.col("kind") == "BlockStored").then(pl.col("ts")).otherwise(None)
        .forward_fill().over("hash").alias("_stored"))
    out = flat.filter(pl.col("kind") == "BlockRemoved").with_columns(age_s=pl.col("ts") - pl.col("_stored"))
    return out.select("_order", "hash", "ts", "age_s")


def _ages(g: pl.DataFrame) -> dict[str, Any]:
    ages = g["age_s"].drop_nulls().to_numpy()
    return {f"evicted_age_p{p}_s": percentile(ages, p) for p in PCTS}


def by_class(run: Run, events: pa.Table, block: int) -> tuple[pa.Table, dict[str, Any]]:
    """(the pilot table's eviction rows, the evidence's `evictions` section)."""
    rem = removals(events).with_columns(pl.col("hash").cast(pl.UInt64))
    req = pl.from_arrow(run.table("requests").select([*COLUMNS, "block_hashes"]))
    frame, source = class_frame(req, block, keep=("block_hashes",))
    names = (*CLASSES, UNKNOWN)
    held = (frame.with_row_index("_req").select("_req", "_class", "block_hashes").explode("block_hashes")
            .drop_nulls("block_hashes").with_columns(pl.col("block_hashes").cast(pl.UInt64))
            .join(rem, left_on="block_hashes", right_on="hash", how="inner"))
    whole = {"requests": frame.height, "evicted_requests": held["_req"].n_unique(), "evicted_blocks": rem.height,
             "aged_blocks": int(rem["age_s"].is_not_null().sum()), **_ages(rem)}
    rows = [{**group_row(frame, "eviction_all"), **{k: whole[k] for k in ("evicted_requests", "evicted_blocks")},
             **_ages(rem)}]
    classes: dict[str, Any] = {}
    for i, name in enumerate(names):
        mine = frame.filter(pl.col("_class") == i)
        if not mine.height and name not in CLASSES:
            continue
        h = held.filter(pl.col("_class") == i)
        once = h.unique("_order")  # a removal counts once per class, however many of its requests hold it
        row = {**group_row(mine, "eviction", cls=name), "evicted_requests": h["_req"].n_unique(),
               "evicted_blocks": once.height, **_ages(once)}
        rows.append(row)
        classes[name] = {k: row[k] for k in ("requests", "evicted_requests", "evicted_blocks", "evicted_age_p50_s",
                                             "evicted_age_p95_s")}
    info = {"cached_source": source, "age": "removal ts minus the block's most recent BlockStored ts before it "
                                           "(the engine's event clock)", "all": whole, "by_class": classes}
    return pa.Table.from_pylist(rows, schema=PILOT_SCHEMA), info
