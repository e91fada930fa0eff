"""The pilot by routing decision (issue 31): queue wait, requests that left a warm candidate, and the router's
predicted against the engine's actual cached tokens, from the `pilot` table's decision rows
(prefixscan.pilot.decisions)."""

from __future__ import annotations

from typing import Any

from prefixscan.report.escape import data as esc
from prefixscan.report.sections.blocks import Block, num, tok

LIMIT = 12  # decision rows shown; the rest stay in the table


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "n/a"


def decisions(rows: list[dict[str, Any]], info: dict[str, Any], pair: Any) -> list[Block]:
    """Blocks for the decision levels; `pair(row, metric)` formats a p50 / p95 as the pilot section does."""
    d = info.get("decisions")
    shown = [r for r in rows if r["level"] in ("decision_all", "decision")]
    if not d or not shown:
        return [("p", "Queue wait by routing decision and predicted against actual cached tokens need the router's "
                      "decision log: `analyze --decisions FILE` (docs/pilot.md).")]
    j, lw = d["join"], d["left_warm"]
    out: list[Block] = [
        ("h", 3, "By routing decision"),
        ("p", f"From the router's decision log: {num(d['read'])} rows read = {num(d['accepted'])} accepted + "
              f"{num(d['rejected'])} rejected (the rejects table); {num(j['joined'])} joined a request, "
              f"{num(j['decisions_without_request'])} match no request and {num(j['requests_without_decision'])} "
              f"requests have no decision row. Queue wait: the decision row's `queue_wait_ms`, else the request log's. "
              f"{num(lw['requests'])} requests ({_share(lw['requests'], d['accepted'])}) left a warm candidate: "
              f"{num(lw['by_decision_name'])} by a fallback or overflow decision, {num(lw['by_candidates_only'])} "
              "more passed a warmer candidate (rule in docs/pilot.md)."),
        ("table", ["decision", "requests", "queue wait p50 / p95", "TTFT p50 / p95", "left warm",
                   "predicted / actual cached", "diverged by more than a block"],
         [[esc(r["decision"] if r["level"] == "decision" else "all decisions"), num(r["requests"]),
           pair(r, "queue_wait"), pair(r, "ttft"),
           f"{num(r['left_warm_requests'])} ({_share(r['left_warm_requests'], r['requests'])})",
           f"{tok(r['predicted_cached_tokens'])} / {tok(r['actual_cached_tokens'])}",
           f"{num(r['diverged_requests'])} of {num(r['compared_requests'])}"] for r in shown[:LIMIT + 1]]),
    ]
    if len(shown) > LIMIT + 1:
        out.append(("p", f"{num(len(shown) - LIMIT - 1)} more decisions in the run's `pilot` table."))
    div = d.get("divergence") or {}
    if div.get("systematic"):
        out.append(("p", f"**Predicted and actual diverge regularly**: on {num(div['diverged'])} of "
                         f"{num(div['compared'])} decisions ({_share(div['diverged'], div['compared'])}) they differ "
                         "by more than one block. Seed 002's rule: a regular divergence is an input-identification "
                         "problem, not a GPU problem (a hidden timestamp, a template change, a different tokenizer "
                         "on part of the fleet, a normaliser that differs between services)."))
    return out
