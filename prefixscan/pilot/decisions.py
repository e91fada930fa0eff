"""The pilot by routing decision: the router's decision log joined to the requests by id.

Per `decision` value and over all decision rows: queue wait (the row's own, else the joined request's),
the requests that left a warm candidate (by the decision's name, or by passing a warmer candidate) and
predicted against actual cached tokens, diverging regularly by `systematic`. The rules, and why each, are
docs/pilot.md's "The router's decision log". The join is reported, never silent: unjoined rows on either
side are counted, and a decision log that matches no request is one note.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from prefixscan.pilot.latency import COLUMNS, PILOT_SCHEMA, class_frame, group_row, of_frame, shown
from prefixscan.read.decisions import DecisionLog

LEAVE_WORDS = "(?i)fallback|overflow"
DIVERGE_SHARE = 0.1
DIVERGE_MIN_ROWS = 5


def _flags(d: pl.DataFrame, block: int) -> pl.DataFrame:
    """Per decision row: joined, left-warm (by name, by candidates), compared and diverged."""
    none_listed = (d["candidates_known"] & (d["candidates"] == 0)).fill_null(False)
    by_name = d["decision"].str.contains(LEAVE_WORDS) & ~none_listed
    best, mine = pl.col("best_candidate_tokens"), pl.col("selected_candidate_tokens")
    names_only = best.is_null() & pl.col("candidates_known") & (pl.col("candidates") > 0) & \
        (pl.col("selected_is_candidate") == False)  # noqa: E712 (a polars expression)
    d = d.with_columns(
        _by_name=by_name,
        _by_candidates=(((best >= block) & (mine < best)) | names_only).fill_null(False),
        _joined=pl.col("_class").is_not_null(),
        queue_wait_s=pl.coalesce("queue_wait_s", "queue_wait_s_req"),
        _actual=pl.coalesce("actual_cached_tokens", "actual_cached_tokens_req"),
    ).with_columns(_known=pl.col("_known").fill_null(False), _cached=pl.col("_cached").fill_null(0),
                   _prompt_known=pl.col("_prompt_known").fill_null(0))
    compared = pl.col("predicted_cached_tokens").is_not_null() & pl.col("_actual").is_not_null()
    return d.with_columns(_left=pl.col("_by_name") | pl.col("_by_candidates"), _compared=compared,
                          _diverged=compared & diverges(pl.col("predicted_cached_tokens") - pl.col("_actual"), block))


def _row(g: pl.DataFrame, level: str, decision: str | None) -> dict[str, Any]:
    row = group_row(g, level)
    c = g.filter(pl.col("_compared"))
    prefill = g["prefill_tokens"].drop_nulls()
    row.update(decision=decision, joined_requests=int(g["_joined"].sum()), compared_requests=c.height,
               predicted_cached_tokens=int(c["predicted_cached_tokens"].sum()),
               actual_cached_tokens=int(c["_actual"].sum()), diverged_requests=int(g["_diverged"].sum()),
               left_warm_requests=int(g["_left"].sum()), prefill_tokens=int(prefill.sum()) if len(prefill) else None)
    return row


def _divergence(row: dict[str, Any], over: pl.DataFrame, block: int) -> dict[str, Any]:
    """Predicted against actual over the compared rows, and whether it is regular (systematic)."""
    n, k = row["compared_requests"], row["diverged_requests"]
    c = over.filter(pl.col("_diverged"))
    above = int((c["predicted_cached_tokens"] > c["_actual"]).sum())
    return {"compared": n, "diverged": k, "share": k / n if n else None, "predicted_above_actual": above,
            "actual_above_predicted": k - above, "block_tokens": block,
            "systematic": systematic(n, k)}


def diverges(gap: Any, block: int) -> Any:
    """One request diverges when predicted and actual cached tokens are more than one block apart (one home:
    the router's prediction and prefixscan's use it); `gap` is a polars expression or a numpy array."""
    return abs(gap) > block


def systematic(compared: int, diverged: int) -> bool:
    """Seed 002's "regularly diverge", made a number: at least DIVERGE_MIN_ROWS compared requests of which
    DIVERGE_SHARE or more diverged (one home: the router's prediction and prefixscan's use it)."""
    return compared >= DIVERGE_MIN_ROWS and diverged >= DIVERGE_SHARE * compared


def divergence_note(div: dict[str, Any], where: str) -> str:
    """The seed's rule, said in the output when predicted and actual diverge regularly."""
    return (f"the router's predicted and the engine's actual cached tokens differ by more than one block "
            f"({div['block_tokens']} tokens) on {div['diverged']:,} of {div['compared']:,} {where} "
            f"({div['share']:.0%}; predicted above actual on {div['predicted_above_actual']:,}): a regular "
            "divergence is an input-identification problem, not a GPU problem (seed 002): a hidden timestamp, a "
            "template change, a different tokenizer on part of the fleet, or a normaliser that differs between "
            "two services. The findings and the misses table's attribution name the breakers prefixscan sees.")


def _join(d: pl.DataFrame, requests: int, log: DecisionLog) -> tuple[dict[str, Any], list[str]]:
    joined = int(d["_joined"].sum())
    out = {"decision_rows": d.height, "joined": joined, "decisions_without_request": d.height - joined,
           "requests_without_decision": requests - joined}
    notes = []
    if not d.height:
        notes.append(f"--decisions: no decision row to join ({log.read:,} read, {len(log.rejects):,} rejected: see "
                     "the rejects table)")
    elif not joined:
        notes.append(f"--decisions: none of the {d.height:,} decision rows matches a request id of the log's "
                     f"{requests:,} requests; check that both logs carry the same id (--field request_id=PATH)")
    elif d.height - joined or requests - joined:
        notes.append(f"--decisions: {joined:,} decision rows joined a request; {d.height - joined:,} match no "
                     f"request and {requests - joined:,} requests have no decision row (both kept and counted)")
    return out, notes


def measure(path: str | Path, block: int, log: DecisionLog) -> tuple[pa.Table, dict[str, Any], list[str]]:
    """(the pilot table with the decision levels, the summary's `pilot` section with `decisions`, notes)."""
    df = pl.read_parquet(path, columns=[*COLUMNS, "request_id"])
    table, summary = of_frame(df, block)
    frame, _ = class_frame(df, block, keep=("request_id", "actual_cached_tokens"))
    d = log.rows.join(frame.drop("model", "replica"), on="request_id", how="left", suffix="_req")
    d = _flags(d, block)
    rows = [_row(d, "decision_all", None)]
    groups = d.partition_by("decision", as_dict=True)
    for (name,) in sorted(groups, key=lambda k: (-groups[k].height, k[0])):
        rows.append(_row(groups[(name,)], "decision", name))
    table = pa.concat_tables([table, pa.Table.from_pylist(rows, schema=PILOT_SCHEMA)])
    join, notes = _join(d, df.height, log)
    div = _divergence(rows[0], d, block)
    by_div = {r["decision"]: _divergence(r, groups[(r["decision"],)], block) for r in rows[1:]}
    if div["systematic"]:
        notes.append(divergence_note(div, "decision rows that report both"))
    summary["decisions"] = {
        "files": log.files, "read": log.read, "accepted": d.height, "rejected": len(log.rejects),
        "rejects_by_reason": dict(sorted(Counter(r["reason"] for r in log.rejects).items())), "join": join,
        "rules": {"queue_wait": "the decision row's queue_wait_ms, else the joined request's queue wait",
                  "left_warm": "the decision names a fallback or overflow (unless it lists no candidate), or the "
                               "router passed a warmer candidate (per-candidate predictions: the best is at least "
                               "one block and above the selected worker's; names only: the selected worker is "
                               "not among the candidates)",
                  "diverged": f"predicted and actual cached tokens differ by more than one block ({block} tokens)",
                  "systematic": f"at least {DIVERGE_MIN_ROWS} compared rows and {DIVERGE_SHARE:.0%} of them "
                                "diverged: an input-identification problem (seed 002)"},
        "left_warm": {"requests": rows[0]["left_warm_requests"], "share": rows[0]["left_warm_requests"] / d.height
                      if d.height else None, "by_decision_name": int(d["_by_name"].sum()),
                      "by_candidates_only": int((d["_by_candidates"] & ~d["_by_name"]).sum())},
        "divergence": div,
        "all": {**shown(rows[0])},
        "by_decision": {r["decision"]: {**shown(r), "divergence": by_div[r["decision"]]} for r in rows[1:]},
    }
    return table, summary, notes
