"""The pilot's outcome (issue 31): latency by warm, partial and cold request, and input tokens by model and
replica, from the run's `pilot` table (written by analyze when the log carries latency; prefixscan.pilot.latency)."""

from __future__ import annotations

from typing import Any

from prefixscan.report.escape import data as esc
from prefixscan.report.model import ReportData
from prefixscan.report.sections.blocks import Block, num, pct, tok
from prefixscan.report.sections.pilot_decisions import decisions
from prefixscan.report.sections.pilot_prediction import prediction

LIMIT = 12  # model x replica rows shown; the rest stay in the table


def ms(v: float | None) -> str:
    """A latency in milliseconds (the pilot table holds seconds)."""
    return "n/a" if v is None else f"{v * 1000:,.0f} ms"


def _pair(r: dict[str, Any], m: str) -> str:
    return "n/a" if not r[f"{m}_requests"] else f"{ms(r[f'{m}_p50_s'])} / {ms(r[f'{m}_p95_s'])}"


def evictions(rows: list[dict[str, Any]]) -> list[Block]:
    """KV evictions and the age of evicted blocks by class (the pilot table's eviction rows, written by
    `analyze --kv-events`; prefixscan.evidence.evictions)."""
    shown = [r for r in rows if r["level"] in ("eviction_all", "eviction")]
    if not shown:
        return [("p", "KV evictions and the age of evicted prefixes need the engine's KV events: `analyze "
                      "--kv-events EVENTS` (docs/record-events.md).")]
    return [("h", 3, "KV evictions by class"),
            ("p", "From the engine's recorded KV events: a removed block's age is the time since its most recent "
                  "store (the engine's clock). A request met an eviction when one of its blocks had been removed "
                  "and not stored again before it arrived; a class's evictions are those its requests met."),
            ("table", ["class", "requests", "requests that met an eviction", "evictions", "age p50 / p95"],
             [[esc(r["class"] or "all removals"), num(r["requests"]), num(r["evicted_requests"]),
               num(r["evicted_blocks"]), "n/a" if r["evicted_age_p50_s"] is None else
               f"{r['evicted_age_p50_s']:,.3g} s / {r['evicted_age_p95_s']:,.3g} s"] for r in shown])]


def pilot(data: ReportData) -> list[Block]:
    """TTFT, queue wait and end-to-end latency p50 / p95 per class; cached and uncached tokens per pool."""
    p = data.pilot
    if not p:
        return []
    rows, info = p["rows"], p.get("summary") or {}
    src = info.get("cached_source")
    basis = ("the engine's reported cached tokens (`actual_cached_tokens`)" if src == "engine" else
             "the ideal cache's cached tokens (the log reports no engine count)")
    cl = info.get("classes") or {}
    out: list[Block] = [
        ("h", 2, "Pilot: latency by warm, partial and cold requests"),
        ("p", f"Measured from the log's own latency fields. Classes by {basis}: **cold** when fewer than "
              f"{num(cl.get('block_tokens'))} tokens (one block) were cached, **warm** when at least "
              f"{num(100 * cl.get('warm_share', 0.9))}% of the prompt was or at most "
              f"{num(cl.get('warm_uncached_tokens'))} tokens were left to compute, **partial** between. "
              "Percentiles: linear interpolation between the closest ranks; n/a where the log has no value."),
        ("table", ["class", "requests", "TTFT p50 / p95", "queue wait p50 / p95", "end to end p50 / p95"],
         [[esc(r["class"] or "all requests"), num(r["requests"]), _pair(r, "ttft"), _pair(r, "queue_wait"),
           _pair(r, "e2e")] for r in rows if r["level"] in ("class", "all")]),
    ]
    pools = [r for r in rows if r["level"] == "model_replica"]
    out += [("p", "Input tokens by model and replica (the pool that served them): cached tokens skipped prefill, "
                  "uncached were computed."),
            ("table", ["model", "replica", "requests", "cached tokens", "uncached tokens", "TTFT p50 / p95"],
             [[esc(r["model"] if r["model"] is not None else "(none)"),
               esc(r["replica"] if r["replica"] is not None else "(none)"), num(r["requests"]),
               tok(r["cached_tokens"]), tok(r["uncached_tokens"]), _pair(r, "ttft")] for r in pools[:LIMIT]])]
    if len(pools) > LIMIT:
        out.append(("p", f"{num(len(pools) - LIMIT)} more model and replica rows in the run's `pilot` table."))
    out += decisions(rows, info, _pair)
    out += evictions(rows)
    name = data.best_policy
    out += prediction(rows, info, _pair, ms, data.policy(name) if name else None, name, data.policies_source)
    return out


def measured_steps(data: ReportData) -> dict[int, str]:
    """The rollout steps (seed 002; 3, 4, 5 counted from 1) this run's pilot measured, with what it found:
    the rollout section says so instead of asking for a measurement that is above it."""
    info = (data.pilot or {}).get("summary") or {}
    out: dict[int, str] = {}
    pred = info.get("prediction")
    if pred:
        out[3] = (f"measured: the engine reported a {pct(pred['measured']['hit_rate'])} hit rate where the ideal "
                  f"cache predicts {pct(pred['predicted']['hit_rate'])}; {pred['verdict']} (\"Prediction next "
                  "to outcome\" above).")
    d = info.get("decisions")
    if d and d.get("left_warm", {}).get("share") is not None:
        out[4] = (f"measured from the router's decision log: {pct(d['left_warm']['share'])} of decisions left a "
                  "warm candidate (\"By routing decision\" above).")
    warm = (info.get("by_class") or {}).get("warm") or {}
    if warm.get("ttft_requests"):
        out[5] = (f"measured: warm TTFT p50 / p95 {_pair(warm, 'ttft')} (the pilot section above; `prefixscan "
                  "diff` compares it with a control run or pool).")
    return out


def against(c: Any) -> list[Block]:
    """Pilot against control in the report's before/after section (`report --compare-to`): per class, the
    requests, TTFT and queue wait p50 / p95 of both runs, B - A (prefixscan.compare.pilot)."""
    from prefixscan.compare.pilot import pilot_json

    groups = pilot_json(c)["groups"]

    def cell(v: dict[str, Any]) -> str:
        delta = "n/a" if v["delta"] is None else f"{v['delta'] * 1000:+,.0f} ms"
        return f"{ms(v['a'])} / {ms(v['b'])} ({delta})"

    rows = [[esc(g), f"{num(d['requests']['a'])} / {num(d['requests']['b'])}", cell(d["ttft_p50_s"]),
             cell(d["ttft_p95_s"]), cell(d["queue_wait_p95_s"])] for g, d in groups.items()]
    h = groups["all"]["hit_rate"]
    return [("p", f"The pilot's measurement, before / after (change): hit rate {pct(h['a'])} / {pct(h['b'])}, by "
                  f"{esc(c.a.cached_source)} / {esc(c.b.cached_source)} cached tokens."
                  + "".join(f" {esc(w)}." for w in c.warnings)),
            ("table", ["class", "requests", "TTFT p50", "TTFT p95", "queue wait p95"], rows)]
