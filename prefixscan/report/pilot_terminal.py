"""Terminal rendering of the analyze summary's `pilot` section (prefixscan.pilot.latency): TTFT, end-to-end
latency and queue wait by warm / partial / cold request, and input tokens by model and replica."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from prefixscan.report.escape import safe
from prefixscan.report.fmt import print_tables
from prefixscan.report.fmt import tokens as _tok


def secs(v: float | None) -> str:
    """A latency for a table cell: milliseconds below 10 s, seconds above; '-' when unmeasured."""
    if v is None:
        return "-"
    return f"{v * 1000:,.0f} ms" if v < 10 else f"{v:,.1f} s"


def _pair(r: dict[str, Any], m: str) -> str:
    if not r[f"{m}_requests"]:
        return "-"
    return f"{secs(r[f'{m}_p50_s'])} / {secs(r[f'{m}_p95_s'])} (n={r[f'{m}_requests']:,})"


def render_pilot(p: dict[str, Any], console: Console, limit: int = 8) -> None:
    """The pilot tables, after the reuse summary."""
    src = ("the engine's reported cached tokens" if p["cached_source"] == "engine"
           else "the ideal cache's cached tokens (the log reports no engine count)")
    cl = p["classes"]
    cells = [[k, f"{r['requests']:,}", _pair(r, "ttft"), _pair(r, "queue_wait"), _pair(r, "e2e")]
             for k, r in p["by_class"].items()]
    print_tables(console, "Pilot: latency p50 / p95 by class", ["class", "requests", "TTFT", "queue wait",
                                                                 "end to end"], cells, show_edge=False,
                 caption=f"classes by {src}: cold < {cl['block_tokens']} tokens cached; warm >= "
                         f"{cl['warm_share']:.0%} of the prompt cached or <= {cl['warm_uncached_tokens']} "
                         "tokens left to compute; partial between")
    rows = p["by_model_replica"]
    cells = [[safe(r["model"]), safe(r["replica"]), f"{r['requests']:,}", _tok(r["cached_tokens"]),
              _tok(r["uncached_tokens"]), _pair(r, "ttft")] for r in rows[:limit]]
    print_tables(console, "Pilot: input tokens by model and replica", ["model", "replica", "requests", "cached tok",
                                                                       "uncached tok", "TTFT p50 / p95"],
                 cells, keys=2, text={"model", "replica"}, show_edge=False,
                 caption=f"{len(rows) - limit} more in the pilot table" if len(rows) > limit else None)
    if p.get("decisions"):
        render_decisions(p["decisions"], console, limit)
    if p.get("prediction"):
        render_prediction(p["prediction"], p["by_class"], p["all"], console)


def _bare(r: dict[str, Any], m: str) -> str:
    return f"{secs(r[f'{m}_p50_s'])} / {secs(r[f'{m}_p95_s'])}" if r[f"{m}_requests"] else "-"


def _pct(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def render_decisions(d: dict[str, Any], console: Console, limit: int = 8) -> None:
    """Queue wait, left-warm requests and predicted vs actual cached tokens by routing decision."""
    j = d["join"]
    rows = [("all decisions", d["all"]), *list(d["by_decision"].items())[:limit]]
    cells = [[safe(k), f"{r['requests']:,}", _bare(r, "queue_wait"), _pair(r, "ttft"),
              f"{r['left_warm_requests']:,} ({_pct(r['left_warm_requests'], r['requests'])})",
              f"{_tok(r['predicted_cached_tokens'])} / {_tok(r['actual_cached_tokens'])}",
              f"{r['diverged_requests']:,} of {r['compared_requests']:,}"] for k, r in rows]
    more = len(d["by_decision"]) - limit
    print_tables(console, "Pilot: p50 / p95 by routing decision (the router's decision log)",
                 ["decision", "requests", "queue wait", "TTFT", "left warm", "cached pred / actual",
                  "off > 1 block"], cells, keys=1, text={"decision"},
                 show_edge=False,
                 caption=f"decision rows read {d['read']:,} = accepted {d['accepted']:,} + rejected "
                         f"{d['rejected']:,}; joined {j['joined']:,}, {j['decisions_without_request']:,} match no "
                         f"request, {j['requests_without_decision']:,} requests have no decision row"
                         + (f"; {more} more decisions in the pilot table" if more > 0 else ""))


def _classes(c: dict[str, int] | None) -> str:
    return "-" if not c else " / ".join(f"{c[k]:,}" for k in ("warm", "partial", "cold"))


def render_prediction(p: dict[str, Any], by_class: dict[str, Any], every: dict[str, Any], console: Console) -> None:
    """Prefixscan's prediction next to the engine's outcome (prefixscan.pilot.prediction)."""
    pr, rt, me, gap = p["predicted"], p.get("as_routed"), p["measured"], p["gap"]
    sides = [("predicted (ideal cache)", pr), *([("as routed (ideal per replica)", rt)] if rt else []),
             ("measured (engine)", me)]
    cells = [[name, f"{s['hit_rate']:.1%}" if s["hit_rate"] is not None else "-", _tok(s["cached_tokens"]),
              _tok(s["uncached_tokens"]), _classes(s.get("classes")),
              _pair(every, "ttft") if s is me else "-"] for name, s in sides]
    print_tables(console, "Pilot: prediction next to outcome", ["", "hit rate", "cached tok", "prefill tok",
                                                                "warm / partial / cold", "TTFT p50 / p95"],
                 cells, show_edge=False,
                 caption=f"{p['divergence']['compared']:,} requests with the engine's count; gap "
                         f"{_tok(gap['cached_tokens'])} tokens = routing {_tok(gap['lost_routing_tokens'])} + "
                         f"eviction {_tok(gap['lost_eviction_tokens'])} + unexplained "
                         f"{_tok(gap['lost_unexplained_tokens'])} - engine above {_tok(gap['engine_excess_tokens'])}"
                         " (table misses)")
    cells = [[c["predicted_class"], c["class"], f"{c['requests']:,}", _pair(c, "ttft"),
              f"{_tok(c['predicted_cached_tokens'])} / {_tok(c['actual_cached_tokens'])}",
              " / ".join(_tok(c[k]) for k in ("lost_routing_tokens", "lost_eviction_tokens",
                                              "lost_unexplained_tokens", "engine_excess_tokens"))]
             for c in p.get("by_class_pair") or []]
    print_tables(console, "Pilot: predicted class -> measured class", ["predicted", "measured", "requests",
                                                                        "TTFT p50 / p95", "cached pred / actual",
                                                                        "routing / eviction / unexpl. / above"],
                 cells, keys=2, show_edge=False)
