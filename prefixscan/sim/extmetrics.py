"""Metrics of the KV tiers and of disaggregated prefill/decode, added only when a replay had them.

A replay without tiers or a decode pool gets none of these keys or columns, so its tables stay as they
were. Cached tokens by tier sum to the request's cached tokens; recomputed = prompt - cached. Pool
utilisations are time averages over the replay: prefill = busy prefill-lane seconds per prefill worker,
decode = running sequences per `max_num_seqs` and held KV blocks per usable block of each decode worker.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

PREFILL_TARGET_UTILIZATION = 0.8  # "prefill GPUs needed" keeps the pool's busy fraction at or below this


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if len(x) else None


def tier_summary(w: Any, o: Any, m: np.ndarray, tensor_parallel: int) -> dict[str, Any]:
    """Per-policy tier and disaggregation keys for `metrics.summarize` ({} for a plain replay)."""
    t = o.tiers
    out: dict[str, Any] = {}
    prompt = int(w.prompt_tokens[m].sum())
    if "host_tokens" in t:
        cached = o.cached_tokens[m]
        host, shared = t["host_tokens"][m], t["shared_tokens"][m]
        gpu = cached - host - shared
        for name, v in (("gpu", gpu), ("host", host), ("shared", shared)):
            out[f"cached_{name}_tokens"] = int(v.sum())
            out[f"hit_rate_{name}"] = float(v.sum() / prompt) if prompt else None
        out["recomputed_tokens"] = int(prompt - cached.sum())
        load = t["load_s"][m]
        out["tier_load_s_mean"] = _mean(load)
        out["tier_load_s_p95"] = _pct(load, 95)
        out["host_evictions"] = int(t["host_evictions"])
        out["shared_evictions"] = int(t["shared_evictions"])
    if "decode_replica" in t:
        out.update(_pd_summary(w, o, m, tensor_parallel))
    return out


def _pd_summary(w: Any, o: Any, m: np.ndarray, tp: int) -> dict[str, Any]:
    t = o.tiers
    horizon = max(o.horizon_s, 1e-12)
    d = len(t["decode_area_running"])
    busy = float(o.prefill_s.sum())
    wait, tx = t["decode_wait_s"][m], t["transfer_s"][m]
    return {
        "prefill_replicas": o.n_slots,
        "decode_replicas": d,
        "decode_queue_wait_mean_s": _mean(wait),
        "decode_queue_wait_p95_s": _pct(wait, 95),
        "decode_queue_wait_p99_s": _pct(wait, 99),
        "decode_queue_mean": float(t["decode_area_queue"] / horizon),
        "decode_queue_peak": int(t["decode_queue_peak"]),
        "kv_transfer_s_mean": _mean(tx),
        "kv_transfer_s_p95": _pct(tx, 95),
        "prefill_pool_utilization": busy / (o.n_slots * horizon),
        "decode_seq_utilization": float(t["decode_area_running"].sum() / (d * t["decode_max_seqs"] * horizon)),
        "decode_kv_utilization": float(t["decode_area_blocks"].sum() / (d * t["decode_usable_blocks"] * horizon)),
        "prefill_gpus_busy_mean": busy * tp / horizon,
        "prefill_gpus_needed": int(math.ceil(busy / (horizon * PREFILL_TARGET_UTILIZATION))) * tp,
        "decode_gpus": d * tp,
    }


def tier_columns(w: Any, o: Any) -> dict[str, pa.Array]:
    """Per-request columns for `sim_decisions` ({} for a plain replay)."""
    t = o.tiers
    cols: dict[str, pa.Array] = {}
    if "host_tokens" in t:
        host, shared = t["host_tokens"], t["shared_tokens"]
        cols["cached_gpu_tokens"] = pa.array(o.cached_tokens - host - shared, pa.int64())
        cols["cached_host_tokens"] = pa.array(host, pa.int64())
        cols["cached_shared_tokens"] = pa.array(shared, pa.int64())
        cols["recomputed_tokens"] = pa.array(w.prompt_tokens - o.cached_tokens, pa.int64())
        cols["tier_load_s"] = pa.array(t["load_s"], pa.float64())
    if "decode_replica" in t:
        cols["decode_replica"] = pa.array(t["decode_replica"], pa.int32())
        cols["decode_queue_wait_s"] = pa.array(t["decode_wait_s"], pa.float64(), from_pandas=True)
        cols["kv_transfer_s"] = pa.array(t["transfer_s"], pa.float64())
    return cols


COLOCATED_KEYS = ("hit_rate_token_weighted", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "queue_wait_p95_s",
                  "prefill_tokens")


def colocated_comparison(pd: dict[str, Any], colo: dict[str, Any], replicas: int) -> None:
    """Add a co-located fleet's headline (same traffic, prefill + decode replicas) to a P/D summary."""
    pd["colocated_replicas"] = replicas
    for k in COLOCATED_KEYS:
        pd[f"colocated_{k}"] = colo.get(k)
