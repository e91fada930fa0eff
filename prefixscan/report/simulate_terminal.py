"""Render a SimResult for a terminal with rich: one comparison row per policy, best value highlighted; KV tiers
and disaggregated prefill/decode only when the replay had them.

Rendering only: every number comes from `SimResult.policies` (tier and P/D keys from `prefixscan.sim.metrics`).
The oracle is a reference with perfect knowledge, so it is shown but never highlighted as "best".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prefixscan.report.escape import safe
from prefixscan.report.fmt import metric as fmt
from prefixscan.report.fmt import number_tables, print_comparison
from prefixscan.report.model import CLASSES

if TYPE_CHECKING:
    from rich.console import Console

    from prefixscan.sim import SimResult

# (column title, metric key, "max"/"min" is better, formatter)
COLUMNS: list[tuple[str, str, str, str]] = [
    ("hit", "hit_rate_token_weighted", "max", "pct"), ("of ideal", "capture_of_ideal", "max", "pct"),
    ("TTFT p50", "ttft_p50_s", "min", "s"), ("p95", "ttft_p95_s", "min", "s"), ("p99", "ttft_p99_s", "min", "s"),
    ("wait p95", "queue_wait_p95_s", "min", "s"), ("load", "imbalance_max_mean", "min", "x"),
    ("spill", "spill_rate", "min", "pct"), ("prefill", "prefill_tokens", "min", "short"),
    ("evicted", "evictions", "min", "short"), ("pred ok", "predicted_exact_fraction", "max", "pct"),
]
TIER_COLUMNS = [
    ("hit", "hit_rate_token_weighted", "pct"), ("gpu", "hit_rate_gpu", "pct"), ("host", "hit_rate_host", "pct"),
    ("shared", "hit_rate_shared", "pct"), ("recomputed", "recomputed_tokens", "short"),
    ("load mean", "tier_load_s_mean", "s"), ("load p95", "tier_load_s_p95", "s"),
    ("host evict", "host_evictions", "short"), ("store evict", "shared_evictions", "short"),
]
PD_COLUMNS = [
    ("TTFT p50", "ttft_p50_s", "s"), ("p95", "ttft_p95_s", "s"), ("p99", "ttft_p99_s", "s"),
    ("wait p95", "queue_wait_p95_s", "s"), ("hit", "hit_rate_token_weighted", "pct"),
    ("transfer p95", "kv_transfer_s_p95", "s"), ("decode wait p95", "decode_queue_wait_p95_s", "s"),
    ("decode q peak", "decode_queue_peak", "int"), ("prefill util", "prefill_pool_utilization", "pct"),
    ("decode KV util", "decode_kv_utilization", "pct"), ("prefill GPUs needed", "prefill_gpus_needed", "int"),
]


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
    rows = [[safe(name) + ("*" if name == "oracle" else ""),
             *(f"[bold green]{fmt(s.get(key), kind)}[/]" if name != "oracle" and key in best and s.get(key) == best[key]
               else fmt(s.get(key), kind) for _, key, _, kind in COLUMNS)] for name, s in result.policies.items()]
    print_comparison(console, "Routing policies (best value in bold green; *oracle = perfect-knowledge reference)",
                     ["policy"] + [title for title, *_ in COLUMNS], rows)
    split = [[safe(name), *(fmt(v, kind) for k in CLASSES for v, kind in (
        (s.get(f"{k}_requests"), "int"), (s.get(f"ttft_{k}_p50_s"), "s"), (s.get(f"ttft_{k}_p95_s"), "s")))]
        for name, s in result.policies.items()]
    print_comparison(console, "TTFT by cache outcome (warm = all an unbounded cache would hit; cold = nothing)",
                     ["policy"] + [f"{k} {m}" for k in CLASSES for m in ("n", "p50", "p95")], split)
    if any(s.get("isolation_cost_hit_rate") is not None for s in result.policies.values()):
        print_comparison(console, "What tenant isolation costs (shared minus isolated)",
                         ["policy", "hit rate lost", "extra prefill tok", "TTFT p95 change"],
                         [[safe(name), fmt(s.get("isolation_cost_hit_rate"), "pct"),
                           fmt(s.get("isolation_cost_prefill_tokens"), "short"),
                           fmt(s.get("isolation_cost_ttft_p95_s"), "s")]
                          for name, s in result.policies.items()])
    render_tiers(result.policies, console, result.tables.get("sim_tier_capacity"))
    console.print(
        "hit = cached / prompt tokens over the whole cluster (token-weighted); "
        "of ideal = share of an unbounded single cache's hits;\n"
        "spill = requests sent away from the replica holding their longest prefix; "
        "load = max/mean of time-averaged requests in flight;\n"
        "prefill = tokens computed; pred ok = router-predicted cached tokens equal to what the engine found."
    )


def render_tiers(policies: dict[str, dict[str, Any]], console: Console, sweep: Any = None) -> None:
    """Cached tokens by tier, the disaggregated fleet against the co-located one, the capacity view."""
    if any("hit_rate_gpu" in s for s in policies.values()):
        print_comparison(
            console, "Cached tokens by KV tier (share of prompt tokens; load = lower-tier KV onto the GPU)",
            ["policy"] + [c for c, _, _ in TIER_COLUMNS],
            [[safe(name), *[fmt(s.get(k), kind) for _, k, kind in TIER_COLUMNS]] for name, s in policies.items()])
    if any("decode_replicas" in s for s in policies.values()):
        _render_pd(policies, console)
    if sweep is not None and sweep.num_rows:
        _render_sweep(sweep.to_pylist(), console)


def _render_sweep(rows: list[dict[str, Any]], console: Console) -> None:
    ratios = list(dict.fromkeys(r["second_tier_ratio"] for r in rows))
    axis, policy = rows[0]["second_tier"], rows[0]["policy"]
    table = []
    for gpu in dict.fromkeys(r["gpu_kv_blocks"] for r in rows):
        cells = {r["second_tier_ratio"]: r for r in rows if r["gpu_kv_blocks"] == gpu}
        table.append([f"{gpu:,}", *[
            f"{fmt(cells[x]['hit_rate_token_weighted'], 'pct')} ({fmt(cells[x]['hit_rate_gpu'], 'pct')})"
            for x in ratios
        ]])
    print_comparison(console, f"Capacity view ({safe(policy)}): hit rate (GPU's share)",
                     ["GPU blocks"] + [f"{axis} x{r:g}" for r in ratios], table)
    console.print(f"rows: GPU KV blocks per replica; columns: {axis} tier size as a multiple of the GPU's (0 = none)")


def pd_rows(policies: list[tuple[str, dict[str, Any]]], cell: Callable[[Any, str], str]) -> list[list[str]]:
    """The P/D table's rows (here and in the report): each policy's disaggregated fleet, then the co-located
    fleet at the same traffic when the replay measured one; `cell(value, kind)` formats a PD_COLUMNS value."""
    rows = []
    for name, s in policies:
        rows.append([name, f"{s.get('prefill_replicas')}P + {s.get('decode_replicas')}D",
                     *[cell(s.get(k), kind) for _, k, kind in PD_COLUMNS]])
        if s.get("colocated_replicas") is not None:
            rows.append(["", f"{s['colocated_replicas']} co-located",
                         *[cell(s.get(f"colocated_{k}"), kind) if f"colocated_{k}" in s else "" for _, k, kind in
                           PD_COLUMNS]])
    return rows


def _render_pd(policies: dict[str, dict[str, Any]], console: Console) -> None:
    rows = pd_rows([(safe(name), s) for name, s in policies.items()], fmt)
    print_comparison(console, "Disaggregated prefill/decode vs a co-located fleet at the same traffic "
                     "(P/D TTFT includes the decode queue and the KV transfer)",
                     ["policy", "fleet"] + [c for c, _, _ in PD_COLUMNS], rows, keys=2)
    console.print("co-located = the same GPUs serving both phases; prefill GPUs needed keeps the prefill pool at "
                  "most 80% busy")


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
