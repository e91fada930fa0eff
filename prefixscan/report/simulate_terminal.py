"""Render a SimResult for a terminal with rich: one comparison row per policy, best value highlighted.

Rendering only: every number comes from `SimResult.policies`. The oracle is a reference with perfect
knowledge, so it is shown but never highlighted as "best".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefixscan.report.fmt import metric as fmt
from prefixscan.report.fmt import number_tables, print_comparison, safe

if TYPE_CHECKING:
    from rich.console import Console

    from prefixscan.sim import SimResult

# (column title, metric key, "max"/"min" is better, formatter)
COLUMNS: list[tuple[str, str, str, str]] = [
    ("hit", "hit_rate_token_weighted", "max", "pct"),
    ("of ideal", "capture_of_ideal", "max", "pct"),
    ("TTFT p50", "ttft_p50_s", "min", "s"),
    ("p95", "ttft_p95_s", "min", "s"),
    ("p99", "ttft_p99_s", "min", "s"),
    ("wait p95", "queue_wait_p95_s", "min", "s"),
    ("load", "imbalance_max_mean", "min", "x"),
    ("spill", "spill_rate", "min", "pct"),
    ("prefill", "prefill_tokens", "min", "short"),
    ("evicted", "evictions", "min", "short"),
    ("pred ok", "predicted_exact_fraction", "max", "pct"),
]

SPLIT: list[tuple[str, str]] = [("warm", "warm"), ("partial", "partial"), ("cold", "cold")]


def best_values(policies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Best value per metric among the deployable policies (everything except the oracle)."""
    out: dict[str, Any] = {}
    for _, key, better, _ in COLUMNS:
        vals: list[Any] = [s.get(key) for n, s in policies.items() if n != "oracle" and s.get(key) is not None]
        if vals:
            out[key] = max(vals) if better == "max" else min(vals)
    return out


def render(result: SimResult, console: Console) -> None:
    """Print the workload line, the comparison table and the TTFT split by cache outcome."""
    info, cfg = result.info, result.config
    kv = "unbounded" if info.get("unbounded_kv") else f"{info['kv_blocks_per_replica']:,} blocks"
    ideal = info.get("ideal_hit_rate_token_weighted")
    pools = f"prefill + {cfg['decode_replicas']} decode " if cfg.get("decode_replicas") else ""
    console.print(
        f"Replayed {info['requests']:,} requests ({info['measured_requests']:,} measured) "
        f"over {info['span_s']:,.0f} s "
        f"on {cfg['replicas']} {pools}replicas, KV {kv} of {info['block_size']} tokens, prefill model "
        f"{safe(info['prefill_model'])}, router knowledge {safe(cfg['knowledge'])}"
        + (f" (delay {cfg['event_delay_s']} s)" if cfg["knowledge"] == "delayed" else "")
        + (", tenants isolated" if cfg.get("isolate_tenants") else "")
    )
    if ideal is not None:
        console.print(f"Ideal-cache hit rate (token-weighted, one unbounded cache): {ideal:.1%}")
    best = best_values(result.policies)
    rows = []
    for name, s in result.policies.items():
        cells = []
        for _, key, _, kind in COLUMNS:
            text = fmt(s.get(key), kind)
            if name != "oracle" and key in best and s.get(key) == best[key]:
                text = f"[bold green]{text}[/]"
            cells.append(text)
        rows.append([safe(name) + ("*" if name == "oracle" else ""), *cells])
    print_comparison(console, "Routing policies (best value in bold green; *oracle = perfect-knowledge reference)",
                     ["policy"] + [title for title, *_ in COLUMNS], rows)
    split = []
    for name, s in result.policies.items():
        row = [safe(name)]
        for _, key in SPLIT:
            row += [
                fmt(s.get(f"{key}_requests"), "int"),
                fmt(s.get(f"ttft_{key}_p50_s"), "s"),
                fmt(s.get(f"ttft_{key}_p95_s"), "s"),
            ]
        split.append(row)
    print_comparison(console, "TTFT by cache outcome (warm = all an unbounded cache would hit; cold = nothing)",
                     ["policy"] + [f"{label} {m}" for label, _ in SPLIT for m in ("n", "p50", "p95")], split)
    if any(s.get("isolation_cost_hit_rate") is not None for s in result.policies.values()):
        print_comparison(console, "What tenant isolation costs (shared minus isolated)",
                         ["policy", "hit rate lost", "extra prefill tok", "TTFT p95 change"],
                         [[safe(name), fmt(s.get("isolation_cost_hit_rate"), "pct"),
                           fmt(s.get("isolation_cost_prefill_tokens"), "short"),
                           fmt(s.get("isolation_cost_ttft_p95_s"), "s")]
                          for name, s in result.policies.items()])
    from prefixscan.report.simulate_tiers_terminal import render_tiers

    render_tiers(result.policies, console, result.tables.get("sim_tier_capacity"))
    console.print(
        "hit = cached / prompt tokens over the whole cluster (token-weighted); "
        "of ideal = share of an unbounded single cache's hits;\n"
        "spill = requests sent away from the replica holding their longest prefix; "
        "load = max/mean of time-averaged requests in flight;\n"
        "prefill = tokens computed; pred ok = router-predicted cached tokens equal to what the engine found."
    )


def render_listing(rows: list[dict[str, Any]], run: str, console: Console) -> None:
    """`simulate RUN --list`: one row per stored simulation; the one readers use by default is marked."""
    from rich import box

    if not rows:
        console.print(f"{safe(run)} has no simulation; run `prefixscan simulate {safe(run)}` first")
        return
    cells = [[("* " if r["default"] else "  ") + safe(r["name"]), safe(", ".join(r["policies"])), str(r["replicas"]),
              f"{r['kv_blocks_per_replica']:,}" if isinstance(r["kv_blocks_per_replica"], int) else "-",
              f"{r['requests'] or 0:,}", safe(r["dir"])] for r in rows]
    for t in number_tables(console, f"Simulations in {safe(run)} (* = used by report/estimate without --simulation)",
                           ["name", "policies", "replicas", "KV blocks/replica", "requests", "tables in"], cells,
                           keys=1, text={"policies", "tables in"}, box=box.SIMPLE):
        console.print(t)
