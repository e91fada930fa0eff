"""The capacity view of a tiered fleet: hit rate against GPU KV size and against the second tier's size.

One policy is replayed over a grid: GPU KV blocks per replica at fractions / multiples of the configured
size, times a second tier (the host tier, or the shared store when only that is configured) at multiples
of the GPU size (SGLang's `--hicache-ratio` is the host/GPU ratio; 0 = no second tier). Each cell is a
full replay, so the view includes routing, queueing and eviction, not only an LRU stack distance; the
rows say where reuse is captured (GPU / host / shared) and what recomputation is left.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from prefixscan.sim.config import SimConfig

GPU_FACTORS = (0.25, 0.5, 1.0, 2.0)
TIER_RATIOS = (0.0, 1.0, 2.0, 4.0, 8.0)


def tier_axis(cfg: SimConfig) -> str:
    """Which tier the sweep sizes: host unless only a shared store is configured."""
    has_host = bool(cfg.host_kv_blocks or cfg.host_kv_gib)
    has_shared = bool(cfg.shared_kv_blocks or cfg.shared_kv_gib)
    return "shared" if has_shared and not has_host else "host"


def capacity_grid(
    table: Any,
    cfg: SimConfig,
    policy: str,
    capacity: int,
    run: Any,
    gpu_factors: tuple[float, ...] = GPU_FACTORS,
    tier_ratios: tuple[float, ...] = TIER_RATIOS,
) -> pa.Table:
    """Replay `policy` at every (GPU size, second-tier size); `run(table, cfg) -> summary dict` replays
    one config (the caller's `simulate`), so every cell is computed exactly as a normal replay."""
    axis = tier_axis(cfg)
    rows = []
    for gf in gpu_factors:
        gpu = max(2, int(round(capacity * gf)))
        for ratio in tier_ratios:
            tier = int(round(gpu * ratio))
            if axis == "host":
                sizes: dict[str, Any] = {"host_kv_blocks": tier, "host_kv_gib": 0.0}
                other = bool(cfg.shared_kv_blocks or cfg.shared_kv_gib)
            else:
                sizes = {"shared_kv_blocks": tier, "shared_kv_gib": 0.0}
                other = False
            sizes["router_sees_tiers"] = cfg.router_sees_tiers and (tier > 0 or other)
            c = dataclasses.replace(cfg, kv_blocks=gpu, unbounded_kv=False, policies=(policy,),
                                    decision_log=False, compare_isolation=False, decode_replicas=0, tier_sweep=False,
                                    **sizes)
            s = run(table, c)
            rows.append({
                "policy": policy,
                "gpu_kv_blocks": gpu,
                "second_tier": axis,
                "second_tier_blocks": tier,
                "second_tier_ratio": ratio,
                "hit_rate_token_weighted": s.get("hit_rate_token_weighted"),
                "hit_rate_gpu": s.get("hit_rate_gpu", s.get("hit_rate_token_weighted")),
                "hit_rate_host": s.get("hit_rate_host", 0.0),
                "hit_rate_shared": s.get("hit_rate_shared", 0.0),
                "recomputed_tokens": s.get("recomputed_tokens", s.get("prefill_tokens")),
                "ttft_p95_s": s.get("ttft_p95_s"),
            })
    return pa.Table.from_pylist(rows)
