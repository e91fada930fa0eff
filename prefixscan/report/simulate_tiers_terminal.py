"""Terminal tables for KV tiers and disaggregated prefill/decode, shown only when a replay had them.

Rendering only: every number comes from `SimResult.policies` (keys from `prefixscan.sim.metrics`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefixscan.report.fmt import metric as fmt
from prefixscan.report.fmt import print_comparison, safe

if TYPE_CHECKING:
    from rich.console import Console

TIER_COLUMNS = [
    ("hit", "hit_rate_token_weighted", "pct"),
    ("gpu", "hit_rate_gpu", "pct"),
    ("host", "hit_rate_host", "pct"),
    ("shared", "hit_rate_shared", "pct"),
    ("recomputed", "recomputed_tokens", "short"),
    ("load mean", "tier_load_s_mean", "s"),
    ("load p95", "tier_load_s_p95", "s"),
    ("host evict", "host_evictions", "short"),
    ("store evict", "shared_evictions", "short"),
]

PD_COLUMNS = [
    ("TTFT p50", "ttft_p50_s", "s"),
    ("p95", "ttft_p95_s", "s"),
    ("p99", "ttft_p99_s", "s"),
    ("wait p95", "queue_wait_p95_s", "s"),
    ("hit", "hit_rate_token_weighted", "pct"),
    ("transfer p95", "kv_transfer_s_p95", "s"),
    ("decode wait p95", "decode_queue_wait_p95_s", "s"),
    ("decode q peak", "decode_queue_peak", "int"),
    ("prefill util", "prefill_pool_utilization", "pct"),
    ("decode KV util", "decode_kv_utilization", "pct"),
    ("prefill GPUs needed", "prefill_gpus_needed", "int"),
]


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


def _render_pd(policies: dict[str, dict[str, Any]], console: Console) -> None:
    rows = []
    for name, s in policies.items():
        fleet = f"{s.get('prefill_replicas')}P + {s.get('decode_replicas')}D"
        rows.append([safe(name), fleet, *[fmt(s.get(k), kind) for _, k, kind in PD_COLUMNS]])
        if s.get("colocated_replicas") is not None:
            colo = [fmt(s.get(f"colocated_{k}"), kind) if f"colocated_{k}" in s else "" for _, k, kind in PD_COLUMNS]
            rows.append(["", f"{s['colocated_replicas']} co-located", *colo])
    print_comparison(console, "Disaggregated prefill/decode vs a co-located fleet at the same traffic "
                     "(P/D TTFT includes the decode queue and the KV transfer)",
                     ["policy", "fleet"] + [c for c, _, _ in PD_COLUMNS], rows, keys=2)
    console.print("co-located = the same GPUs serving both phases; prefill GPUs needed keeps the prefill pool at "
                  "most 80% busy")
