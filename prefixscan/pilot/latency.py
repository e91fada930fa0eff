"""The pilot's outcome, measured from its own logs: latency of warm, partial and cold requests.

The requests table's latency columns (`ttft_s`, `e2e_s`, `queue_wait_s`, read/latency.py) grouped by class
and by model and replica (the pool), with cached and uncached input tokens. The rules are docs/pilot.md's
"Warm, partial and cold": a request is classed by the engine's cached tokens when the log reports them
(else the ideal cache's; never a mix: a request without the engine's count is `unknown`), cold below one
block, warm at WARM_SHARE of its prompt or within WARM_UNCACHED tokens of it; token sums count cached tokens
up to the prompt; percentiles are numpy's default (linear) rule, null for a group with no value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from prefixscan.schema import fields

WARM_SHARE = 0.9
WARM_UNCACHED = 256
CLASSES = ("warm", "partial", "cold")
UNKNOWN = "unknown"  # engine-counted run, request without the engine's count
METRICS = ("ttft", "e2e", "queue_wait")
PCTS = (50, 95)
NONE_KEY = "(none)"
LATENCY = ("ttft_s", "e2e_s", "queue_wait_s")

PILOT_SCHEMA = pa.schema([
    *fields("level:string! model:string replica:string class:string requests:int64! cached_requests:int64! "
            "prompt_tokens:int64! cached_tokens:int64! uncached_tokens:int64!"),
    *[f for m in METRICS for f in fields(f"{m}_requests:int64! " + " ".join(f"{m}_p{p}_s:float64" for p in PCTS))],
    # levels `decision_all` and `decision` only, from the router's decision log (prefixscan.pilot.decisions)
    *fields("decision:string joined_requests:int64 compared_requests:int64 predicted_cached_tokens:int64 "
            "actual_cached_tokens:int64 diverged_requests:int64 left_warm_requests:int64 prefill_tokens:int64"),
    # levels `prediction_all` and `prediction` only: prefixscan's prediction next to the engine's outcome
    # (prefixscan.pilot.prediction); the token columns above then hold prefixscan's ideal cache as predicted
    *fields("predicted_class:string lost_routing_tokens:int64 lost_eviction_tokens:int64 "
            "lost_unexplained_tokens:int64 engine_excess_tokens:int64"),
    # levels `eviction_all` and `eviction` only, from recorded KV events (prefixscan.evidence.evictions)
    *fields("evicted_requests:int64 evicted_blocks:int64 evicted_age_p50_s:float64 evicted_age_p95_s:float64"),
])


def percentile(values: np.ndarray, p: float) -> float | None:
    """The p-th percentile by numpy's default (linear) rule; None for no value."""
    return float(np.percentile(values, p, method="linear")) if len(values) else None


def class_codes(cached: np.ndarray, prompt: np.ndarray, block: int) -> np.ndarray:
    """Per request, the index in CLASSES of its class (the module docstring gives the rule and why)."""
    out = np.ones(len(cached), dtype=np.int8)  # partial
    out[(cached >= WARM_SHARE * prompt) | (prompt - cached <= WARM_UNCACHED)] = 0  # warm
    out[cached < block] = 2  # cold
    return out


def classify(cached: np.ndarray, prompt: np.ndarray, block: int) -> np.ndarray:
    """warm / partial / cold per request, by name (`class_codes`)."""
    return np.asarray(CLASSES, dtype=object)[class_codes(cached, prompt, block)]


def has_latency(path: str | Path) -> bool:
    """Whether any request of the requests table carries a latency value (the pilot table is written).
    Read from the Parquet footer's null counts where it has them, so a log without latency (the usual
    case, and every hashed trace) costs no column read."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    names = f.schema_arrow.names
    if not all(c in names for c in LATENCY):
        return False
    md = f.metadata
    index = {md.schema.column(i).name: i for i in range(md.num_columns)}
    for rg in range(md.num_row_groups):
        group = md.row_group(rg)
        for c in LATENCY:
            stats = group.column(index[c]).statistics
            if stats is not None and stats.has_null_count:
                nulls = stats.null_count
            else:  # a footer without the count: read this column of this row group
                nulls = f.read_row_group(rg, columns=[c]).column(0).null_count
            if nulls < group.num_rows:
                return True
    return False


def measure(path: str | Path, block: int) -> tuple[pa.Table, dict[str, Any]] | None:
    """(the pilot table, the summary's `pilot` section) of a requests table, or None when no request
    has a latency value."""
    if not has_latency(path):
        return None
    df = pl.read_parquet(path, columns=COLUMNS)
    return of_frame(df, block)


COLUMNS = ["model", "replica", "prompt_tokens", "cached_tokens", "actual_cached_tokens", *LATENCY]


def of_frame(df: pl.DataFrame, block: int) -> tuple[pa.Table, dict[str, Any]]:
    """`measure` over requests already in memory (columns as the requests table's). Classes are small
    integer codes and groups one partition pass, so a log of millions of requests costs a few numpy
    passes, not a Python object per request."""
    frame, source = class_frame(df, block)
    rows = [group_row(frame, "all", None, None, None)]
    by_class = frame.partition_by("_class", as_dict=True)
    for i, name in enumerate((*CLASSES, UNKNOWN)):
        g = by_class.get((i,))
        if g is not None or name in CLASSES:  # the three classes always; unknown when it occurs
            rows.append(group_row(g if g is not None else frame.clear(), "class", None, None, name))
    pools = frame.partition_by("model", "replica", as_dict=True)
    for (model, replica) in sorted(pools, key=lambda k: (k[0] is None, k[0] or "", k[1] is None, k[1] or "")):
        rows.append(group_row(pools[(model, replica)], "model_replica", model, replica, None))
    table = pa.Table.from_pylist(rows, schema=PILOT_SCHEMA)
    return table, _summary(rows, source, block, frame)


def class_frame(df: pl.DataFrame, block: int, keep: tuple[str, ...] = ()) -> tuple[pl.DataFrame, str]:
    """(per request: model, replica, latencies, `keep` columns and the class columns `group_row` reads;
    the cached source, `engine` or `ideal`)."""
    engine = df["actual_cached_tokens"].null_count() < df.height
    source = "engine" if engine else "ideal"
    cached = df["actual_cached_tokens"] if engine else df["cached_tokens"]
    known = cached.is_not_null().to_numpy()
    c = cached.fill_null(0).to_numpy().astype(np.int64)
    prompt = df["prompt_tokens"].to_numpy().astype(np.int64)
    codes = class_codes(c, prompt, block)
    codes[~known] = len(CLASSES)  # unknown
    frame = df.select("model", "replica", *LATENCY, *keep).with_columns(
        pl.Series("_class", codes), pl.Series("_cached", np.where(known, np.minimum(c, prompt), 0)),
        pl.Series("_known", known), pl.Series("_prompt_known", np.where(known, prompt, 0)))
    return frame, source


def group_row(g: pl.DataFrame, level: str, model: str | None = None, replica: str | None = None,
              cls: str | None = None) -> dict[str, Any]:
    """One row of the pilot table: request and token counts, latency percentiles of a group of `class_frame`."""
    cached = int(g["_cached"].sum()) if g.height else 0
    prompt = int(g["_prompt_known"].sum()) if g.height else 0
    row: dict[str, Any] = {"level": level, "model": model, "replica": replica, "class": cls,
                           "requests": g.height, "cached_requests": int(g["_known"].sum()) if g.height else 0,
                           "prompt_tokens": prompt, "cached_tokens": cached, "uncached_tokens": prompt - cached}
    for m, col in zip(METRICS, LATENCY, strict=True):
        v = g[col].drop_nulls().to_numpy()
        row[f"{m}_requests"] = len(v)
        for p in PCTS:
            row[f"{m}_p{p}_s"] = percentile(v, p)
    return row


KEYS = ("level", "model", "replica", "class", "decision", "predicted_class")  # a pilot row's grouping keys


def shown(row: dict[str, Any]) -> dict[str, Any]:
    """A pilot row as the summary shows it: without its grouping keys."""
    return {k: v for k, v in row.items() if k not in KEYS}


def _summary(rows: list[dict[str, Any]], source: str, block: int, frame: pl.DataFrame) -> dict[str, Any]:
    """The `pilot` section of the analyze summary (docs/pilot.md)."""
    return {
        "cached_source": source,
        "classes": {"warm": f"not cold, and cached >= {WARM_SHARE:.0%} of prompt tokens or at most "
                            f"{WARM_UNCACHED} prompt tokens uncached",
                    "partial": "between cold and warm",
                    "cold": f"cached < {block} tokens (one block)",
                    "warm_share": WARM_SHARE, "warm_uncached_tokens": WARM_UNCACHED, "block_tokens": block,
                    "unknown": "the engine's cached count is missing on this request" if source == "engine" else None},
        "percentile_rule": "linear interpolation between the closest ranks (numpy's default)",
        "requests_with": {m: int(frame[c].is_not_null().sum()) for m, c in zip(METRICS, LATENCY, strict=True)},
        "all": shown(rows[0]),
        "by_class": {r["class"]: shown(r) for r in rows if r["level"] == "class"},
        "by_model_replica": [{"model": r["model"] if r["model"] is not None else NONE_KEY,
                              "replica": r["replica"] if r["replica"] is not None else NONE_KEY, **shown(r)}
                             for r in rows if r["level"] == "model_replica"],
    }
