"""Prediction next to outcome: what prefixscan predicted for the pilot's traffic (I, the ideal cache) against
what the engine did (A), on the requests whose log line carries the engine's cached tokens, with the ideal
cache of the replica that served each request (R) between them.

The gap is the miss attribution's (the misses table, never recomputed here): I - A = routing (I - R) +
eviction + unexplained - engine excess. A request diverges when |I - A| is over one block, by its largest
cause; "regular" is the decision log's rule (`pilot.decisions.systematic`). Each request is classed twice
by the one class rule, by I and by A. docs/pilot.md, "Prediction next to outcome".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from prefixscan.pilot.decisions import diverges, systematic
from prefixscan.pilot.latency import CLASSES, COLUMNS, PILOT_SCHEMA, class_codes, class_frame, group_row, shown

CAUSES = ("routing", "eviction", "unexplained", "engine_excess")
LOST = ("lost_routing_tokens", "lost_eviction_tokens", "lost_unexplained_tokens", "engine_excess_tokens")
MISSES = ["seq", "ideal_cached_tokens", "replica_cached_tokens", *LOST]


def _frame(requests: str | Path, misses: pa.Table | str | Path, block: int) -> pl.DataFrame:
    """The requests with an engine count, with I, R, the lost columns, and both classes."""
    req = pl.read_parquet(requests, columns=["seq", *COLUMNS])
    mis = pl.read_parquet(misses, columns=MISSES) if not isinstance(misses, pa.Table) else \
        pl.from_arrow(misses.select(MISSES))
    df = req.join(mis, on="seq", how="inner").filter(pl.col("actual_cached_tokens").is_not_null())  # type: ignore[arg-type]  # from_arrow(Table): a DataFrame
    frame, _ = class_frame(df, block, keep=("actual_cached_tokens", *MISSES[1:]))
    ideal = frame["ideal_cached_tokens"].to_numpy().astype(np.int64)
    prompt = df["prompt_tokens"].to_numpy().astype(np.int64)
    lost = frame.select(LOST).fill_null(0).to_numpy().astype(np.int64).reshape(frame.height, len(LOST))
    gap = ideal - frame["actual_cached_tokens"].to_numpy().astype(np.int64)
    cause = np.where(diverges(gap, block), lost.argmax(axis=1), -1)
    return frame.with_columns(pl.Series("_pclass", class_codes(ideal, prompt, block)),
                              pl.Series("_prompt", prompt), pl.Series("_cause", cause))


def _row(g: pl.DataFrame, level: str, predicted: str | None, measured: str | None) -> dict[str, Any]:
    row = group_row(g, level, cls=measured)
    row.update(predicted_class=predicted, compared_requests=g.height,
               predicted_cached_tokens=int(g["ideal_cached_tokens"].sum()),
               actual_cached_tokens=int(g["actual_cached_tokens"].sum()),
               diverged_requests=int((g["_cause"] >= 0).sum()),
               **{c: int(g[c].fill_null(0).sum()) for c in LOST})
    return row


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _sides(f: pl.DataFrame, has_replica: bool) -> dict[str, Any]:
    """Predicted, as routed and measured: hit rate, cached and uncached (prefill) tokens, class counts."""
    prompt = int(f["_prompt"].sum())
    ideal = int(f["ideal_cached_tokens"].sum())
    engine = int(f["_cached"].sum())  # the engine's count up to each prompt (prefixscan.pilot.latency)
    counts = {k: {c: int((f[col] == i).sum()) for i, c in enumerate(CLASSES)}
              for k, col in (("predicted", "_pclass"), ("measured", "_class"))}
    out: dict[str, Any] = {
        "predicted": {"basis": "prefixscan's ideal cache of the log as sent (one cache for all replicas)",
                      "hit_rate": _rate(ideal, prompt), "cached_tokens": ideal, "uncached_tokens": prompt - ideal,
                      "classes": counts["predicted"]},
        "as_routed": None,
        "measured": {"basis": "the engine's reported cached tokens", "hit_rate": _rate(engine, prompt),
                     "cached_tokens": engine, "uncached_tokens": prompt - engine, "classes": counts["measured"]},
    }
    if has_replica:
        routed = int(f["replica_cached_tokens"].fill_null(0).sum())
        out["as_routed"] = {"basis": "an ideal cache per replica, each request on the replica that served it",
                            "hit_rate": _rate(routed, prompt), "cached_tokens": routed,
                            "uncached_tokens": prompt - routed}
    return out


def _divergence(f: pl.DataFrame, block: int) -> dict[str, Any]:
    """Diverged requests, by cause; regular (systematic) overall and for the input-identification part."""
    n = f.height
    cause = f["_cause"].to_numpy()
    k = int((cause >= 0).sum())
    gap = (f["ideal_cached_tokens"] - f["actual_cached_tokens"]).to_numpy()
    by = {c: int((cause == i).sum()) for i, c in enumerate(CAUSES)}
    ident = by["unexplained"] + by["engine_excess"]
    return {"compared": n, "diverged": k, "share": _rate(k, n), "block_tokens": block,
            "predicted_above_actual": int(((cause >= 0) & (gap > 0)).sum()),
            "actual_above_predicted": int(((cause >= 0) & (gap < 0)).sum()),
            "by_cause": by, "systematic": systematic(n, k),
            "input_identification": {"requests": ident, "share": _rate(ident, n), "systematic": systematic(n, ident)}}


def verdict(div: dict[str, Any], mismatch: bool) -> str:
    """One sentence: what the divergence says, by seed 002's rule and the attribution's causes."""
    by, ident = div["by_cause"], div["input_identification"]
    if not div["compared"]:
        return "no request carries the engine's cached tokens: nothing to compare"
    if not div["diverged"]:
        return (f"prediction and outcome agree: no request of {div['compared']:,} differs by more than one block "
                f"({div['block_tokens']} tokens)")
    head = (f"{div['diverged']:,} of {div['compared']:,} requests ({div['share']:.0%}) differ from the prediction "
            f"by more than one block; by their largest cause: routing {by['routing']:,}, eviction {by['eviction']:,}, "
            f"unexplained {by['unexplained']:,}, engine above the prediction {by['engine_excess']:,}")
    if ident["systematic"] or mismatch:
        return (head + ". Regular divergence that routing and eviction do not explain is an input-identification "
                "problem, not a GPU problem (seed 002): the engine sees other tokens than the analysis (a template "
                "or tokenizer mismatch, a hidden timestamp, a normaliser that differs between services)"
                + ("; the attribution found the engine's counts above the prediction on this model's requests "
                   "(tokenizer or chat-template mismatch)" if mismatch else ""))
    if div["systematic"]:
        return head + (". The divergence is regular but routing and eviction explain it: the pool, not the input "
                       "(docs/pilot.md)")
    return head + ": not regular (under the seed's rule)"


def measure(requests: str | Path, misses: pa.Table | str | Path, block: int, attribution: dict[str, Any]
            ) -> tuple[pa.Table, dict[str, Any] | None, list[str]]:
    """(the pilot table's prediction rows, the summary's `pilot.prediction`, notes); no rows and None when
    no request carries the engine's cached tokens (nothing measured to put the prediction next to)."""
    f = _frame(requests, misses, block)
    if not f.height:
        return PILOT_SCHEMA.empty_table(), None, []
    rows = [_row(f, "prediction_all", None, None)]
    cells = f.partition_by("_pclass", "_class", as_dict=True)
    for (p, m) in sorted(cells):
        rows.append(_row(cells[(p, m)], "prediction", CLASSES[p], CLASSES[m]))  # every request has a count
    div = _divergence(f, block)
    mismatch = bool(attribution.get("tokenizer_mismatch")) or \
        bool((attribution.get("with_actual") or {}).get("requests_mismatched_model"))
    summary = {**_sides(f, bool(attribution.get("replica_field"))),
               "requests_without_engine_count": int(pl.read_parquet(requests, columns=["actual_cached_tokens"])
                                                    ["actual_cached_tokens"].null_count()),
               "gap": {"hit_rate_points": None, "cached_tokens": rows[0]["predicted_cached_tokens"]
                       - rows[0]["actual_cached_tokens"], **{c: rows[0][c] for c in LOST}},
               "divergence": div, "tokenizer_mismatch": mismatch, "verdict": verdict(div, mismatch),
               "by_class_pair": [{"predicted_class": r["predicted_class"], "class": r["class"], **shown(r)}
                                 for r in rows[1:]]}
    pr, me = summary["predicted"]["hit_rate"], summary["measured"]["hit_rate"]
    summary["gap"]["hit_rate_points"] = pr - me if pr is not None and me is not None else None
    notes = [f"prediction next to outcome: {summary['verdict']}"] if div["diverged"] else []
    return pa.Table.from_pylist(rows, schema=PILOT_SCHEMA), summary, notes
