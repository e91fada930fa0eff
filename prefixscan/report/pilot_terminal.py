"""Terminal rendering of the analyze summary's `pilot` section (prefixscan.pilot): TTFT, end-to-end
latency and queue wait by warm / partial / cold request, and input tokens by model and replica."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from prefixscan.report.fmt import print_tables, safe
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
