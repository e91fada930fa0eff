"""Terminal tables for KV tiers and disaggregated prefill/decode, shown only when a replay had them.

Rendering only: every number comes from `SimResult.policies` (keys from `prefixscan.sim.extmetrics`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefixscan.report.fmt import safe
from prefixscan.report.simulate_terminal import fmt

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
    ("TTFT p50", "ttft_p50_s", "colocated_ttft_p50_s", "s"),
    ("TTFT p95", "ttft_p95_s", "colocated_ttft_p95_s", "s"),
    ("TTFT p99", "ttft_p99_s", "colocated_ttft_p99_s", "s"),
    ("hit", "hit_rate_token_weighted", "colocated_hit_rate_token_weighted", "pct"),
]


def _table(title: str, cols: list[str]) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right", no_wrap=i == 0)
    return t


def render_tiers(policies: dict[str, dict[str, Any]], console: Console, sweep: Any = None) -> None:
    """Cached tokens by tier, the disaggregated fleet against the co-located one, the capacity view."""
    if any("hit_rate_gpu" in s for s in policies.values()):
        t = _table("Cached tokens by KV tier (share of prompt tokens; load = lower-tier KV onto the GPU)",
                   ["policy"] + [c for c, _, _ in TIER_COLUMNS])
        for name, s in policies.items():
            t.add_row(safe(name), *[fmt(s.get(k), kind) for _, k, kind in TIER_COLUMNS])
        console.print(t)
    if any("decode_replicas" in s for s in policies.values()):
        _render_pd(policies, console)
    if sweep is not None and sweep.num_rows:
        _render_sweep(sweep.to_pylist(), console)


def _render_sweep(rows: list[dict[str, Any]], console: Console) -> None:
    ratios = list(dict.fromkeys(r["second_tier_ratio"] for r in rows))
    axis, policy = rows[0]["second_tier"], rows[0]["policy"]
    t = _table(f"Capacity view ({safe(policy)}): hit rate by GPU KV blocks per replica (rows) and "
               f"{axis} tier size as a multiple of the GPU's (columns); (gpu share)",
               ["GPU blocks"] + [f"{axis} x{r:g}" for r in ratios])
    for gpu in dict.fromkeys(r["gpu_kv_blocks"] for r in rows):
        cells = {r["second_tier_ratio"]: r for r in rows if r["gpu_kv_blocks"] == gpu}
        t.add_row(f"{gpu:,}", *[
            f"{fmt(cells[x]['hit_rate_token_weighted'], 'pct')} ({fmt(cells[x]['hit_rate_gpu'], 'pct')})"
            for x in ratios
        ])
    console.print(t)


def _render_pd(policies: dict[str, dict[str, Any]], console: Console) -> None:
    cols = ["policy"] + [f"{c} P/D | co-loc" for c, *_ in PD_COLUMNS]
    cols += ["transfer p95", "decode wait p95", "decode q peak", "prefill util", "decode KV util",
             "prefill GPUs needed"]
    t = _table("Disaggregated prefill/decode vs a co-located fleet at the same traffic "
               "(TTFT includes decode queue and KV transfer)", cols)
    for name, s in policies.items():
        row = [safe(name)]
        for _, k, ck, kind in PD_COLUMNS:
            row.append(f"{fmt(s.get(k), kind)} | {fmt(s.get(ck), kind)}")
        row += [
            fmt(s.get("kv_transfer_s_p95"), "s"),
            fmt(s.get("decode_queue_wait_p95_s"), "s"),
            fmt(s.get("decode_queue_peak"), "int"),
            fmt(s.get("prefill_pool_utilization"), "pct"),
            fmt(s.get("decode_kv_utilization"), "pct"),
            fmt(s.get("prefill_gpus_needed"), "int"),
        ]
        t.add_row(*row)
    console.print(t)
    s0 = next(iter(policies.values()), {})
    if s0.get("colocated_replicas") is not None:
        console.print(
            f"co-located = {s0['colocated_replicas']} replicas serving both phases (prefill + decode pools); "
            "prefill GPUs needed keeps the prefill pool at most 80% busy"
        )
