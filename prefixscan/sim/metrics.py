"""From per-request outcome arrays to the metric tables of one policy.

The cluster hit rate is token-weighted over all replicas (sum cached / sum prompt tokens), never a mean
of per-replica rates (docs/definitions.md, 'Hit rates'). Requests inside the warm-up window are served but not counted.
TTFT classes: warm = the replica held everything an unbounded cache would have (and that is > 0),
partial = some but less, cold = nothing cached.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from prefixscan.sim.kvcache import N_AGE_BUCKETS
from prefixscan.sim.outcome import Outcome
from prefixscan.sim.timing import ServingModel
from prefixscan.sim.workload import Workload

HEADLINE = (
    "hit_rate_token_weighted",
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "imbalance_max_mean",
    "spill_rate",
    "prefill_tokens",
)
PERCENTILES = (50, 95, 99)  # the latency percentiles of the summaries


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if len(x) else None


def _balance(x: np.ndarray) -> tuple[float | None, float | None, float | None]:
    """(max/mean, coefficient of variation, Jain's fairness index) of per-replica values."""
    if len(x) == 0 or x.sum() <= 0:
        return None, None, None
    m = x.mean()
    return float(x.max() / m), float(x.std() / m), float(x.sum() ** 2 / (len(x) * (x * x).sum()))


def _hist_quantile(hist: np.ndarray, q: float) -> float | None:
    """Approximate quantile (seconds) from log2 millisecond buckets: the bucket's upper edge."""
    total = hist.sum()
    if total == 0:
        return None
    k = int(np.searchsorted(np.cumsum(hist), q * total))
    return float(2.0**k) / 1000.0 if k < N_AGE_BUCKETS - 1 else float("inf")


def summarize(w: Workload, o: Outcome, serving: ServingModel) -> dict[str, Any]:
    """One policy's headline and detail metrics (JSON-ready, None where undefined)."""
    m = w.measured
    prompt = w.prompt_tokens[m]
    cached = o.cached_tokens[m]
    ideal = w.ideal_cached[m]
    ttft = (o.first_token_s - w.arrival_s)[m]
    wait = (o.start_s - w.arrival_s)[m]
    warm = (cached >= ideal) & (ideal > 0)
    cold = cached == 0
    partial = ~warm & ~cold
    slots = np.arange(o.n_slots)
    per_req = np.bincount(o.replica[m], minlength=o.n_slots)[slots]
    new = prompt - cached
    pre_tok = np.bincount(o.replica[m], weights=new, minlength=o.n_slots)[slots]
    horizon = max(o.horizon_s, 1e-12)
    outstanding = o.area_outstanding / horizon
    queue = o.area_waiting / horizon
    spilled = o.routed_cached[m] < o.best_cached[m]
    warm_cand = o.best_cached[m] > 0
    pred = o.predicted_cached[m]
    tot_prompt = int(prompt.sum())
    ev = int(o.evictions.sum())
    out: dict[str, Any] = {
        "requests": int(m.sum()),
        "requests_total": int(w.n),
        "knowledge": o.knowledge,
        "prompt_tokens": tot_prompt,
        "cached_tokens": int(cached.sum()),
        "hit_rate_token_weighted": float(cached.sum() / tot_prompt) if tot_prompt else None,
        "ideal_hit_rate_token_weighted": float(ideal.sum() / tot_prompt) if tot_prompt else None,
        "capture_of_ideal": float(cached.sum() / ideal.sum()) if ideal.sum() else None,
        **{f"ttft_p{q}_s": _pct(ttft, q) for q in PERCENTILES},
        "ttft_mean_s": _mean(ttft),
        "queue_wait_mean_s": _mean(wait),
        **{f"queue_wait_p{q}_s": _pct(wait, q) for q in PERCENTILES},
        **dict(zip(("imbalance_max_mean", "load_cv", "load_jain"), _balance(outstanding), strict=True)),
        **dict(zip(("queue_max_mean", "queue_cv", "queue_jain"), _balance(queue), strict=True)),
        **dict(zip(("prefill_tokens_max_mean", "prefill_tokens_cv", "prefill_tokens_jain"),
                   _balance(pre_tok.astype(np.float64)), strict=True)),
        "spill_rate": float(spilled.mean()) if len(spilled) else None,
        "spill_rate_of_warm": float(spilled[warm_cand].mean()) if warm_cand.any() else None,
        "prefill_tokens": int(new.sum()),
        "prefill_gpu_s": float(serving.prefill.seconds_vec(new, cached).sum()),
        "evictions": ev,
        "evicted_age_mean_s": float(o.evict_age_sum.sum() / ev) if ev else None,
        "evicted_age_p50_s": _hist_quantile(o.evict_hist.sum(axis=0), 0.5),
        "predicted_cached_tokens": int(pred.sum()),
        "predicted_abs_error_tokens_mean": float(np.abs(pred - cached).mean()) if len(pred) else None,
        "predicted_exact_fraction": float((pred == cached).mean()) if len(pred) else None,
        "oversized_requests": o.oversized,
        "horizon_s": float(o.horizon_s),
        "requests_per_replica_max_mean": _balance(per_req.astype(np.float64))[0],
    }
    for name, mask in (("warm", warm), ("partial", partial), ("cold", cold)):
        out[f"{name}_requests"] = int(mask.sum())
        for q in PERCENTILES:
            out[f"ttft_{name}_p{q}_s"] = _pct(ttft[mask], q)
    for k, v in sorted(o.extra.items()):
        out[f"policy_{k}"] = v
    return out


def replica_table(w: Workload, o: Outcome, serving: ServingModel) -> pa.Table:
    """One row per replica slot; hit rate here is that replica's own token-weighted rate."""
    m = w.measured
    r = o.replica[m]
    n = o.n_slots
    prompt = np.bincount(r, weights=w.prompt_tokens[m], minlength=n)
    cached = np.bincount(r, weights=o.cached_tokens[m], minlength=n)
    new = w.prompt_tokens[m] - o.cached_tokens[m]
    gpu = np.bincount(r, weights=serving.prefill.seconds_vec(new, o.cached_tokens[m]), minlength=n)
    wait = np.bincount(r, weights=(o.start_s - w.arrival_s)[m], minlength=n)
    reqs = np.bincount(r, minlength=n)
    horizon = max(o.horizon_s, 1e-12)
    with np.errstate(invalid="ignore", divide="ignore"):
        hit = np.where(prompt > 0, cached / np.maximum(prompt, 1), np.nan)
        wait_mean = np.where(reqs > 0, wait / np.maximum(reqs, 1), np.nan)
        age = np.where(o.evictions > 0, o.evict_age_sum / np.maximum(o.evictions, 1), np.nan)
    return pa.table(
        {
            "policy": pa.array([o.policy] * n, pa.string()),
            "replica": pa.array(np.arange(n), pa.int32()),
            "requests": pa.array(reqs, pa.int64()),
            "prompt_tokens": pa.array(prompt.astype(np.int64), pa.int64()),
            "cached_tokens": pa.array(cached.astype(np.int64), pa.int64()),
            "hit_rate_token_weighted": pa.array(hit, pa.float64(), from_pandas=True),
            "prefill_tokens": pa.array((prompt - cached).astype(np.int64), pa.int64()),
            "prefill_gpu_s": pa.array(gpu, pa.float64()),
            "queue_wait_mean_s": pa.array(wait_mean, pa.float64(), from_pandas=True),
            "outstanding_mean": pa.array(o.area_outstanding / horizon, pa.float64()),
            "waiting_mean": pa.array(o.area_waiting / horizon, pa.float64()),
            "evictions": pa.array(o.evictions, pa.int64()),
            "evicted_age_mean_s": pa.array(age, pa.float64(), from_pandas=True),
        }
    )


def decision_table(w: Workload, o: Outcome) -> pa.Table:
    """The per-request routing log, with the seed document's fields."""
    cands = pa.ListArray.from_arrays(pa.array(o.cand_off.astype(np.int32)), pa.array(o.cand_ids, pa.int32()))
    # prefix_key: chain hash of the deepest block the chosen replica held (names the shared prefix)
    k = o.routed_blocks.astype(np.int64)
    last = w.offsets[:-1] + k - 1
    keys = np.where(k > 0, w.block_keys[w.blocks[np.maximum(last, 0)]] if len(w.blocks) else 0, 0)
    prefix_key = pa.array(
        [f"{x:016x}" if kk else None for x, kk in zip(keys.tolist(), k.tolist(), strict=True)], pa.string()
    )
    reasons = np.asarray(o.reasons + [""], dtype=object)[o.reason]
    return pa.table(
        {
            "policy": pa.array([o.policy] * w.n, pa.string()),
            "seq": pa.array(w.seq, pa.int64()),
            "request_id": pa.array(w.request_id.tolist(), pa.string()),
            "arrival_s": pa.array(w.arrival_s, pa.float64()),
            "prefix_key": prefix_key,
            "selected_replica": pa.array(o.replica, pa.int32()),
            "candidate_replicas": cands,
            "predicted_cached_tokens": pa.array(o.predicted_cached, pa.int64()),
            "actual_cached_tokens": pa.array(o.cached_tokens, pa.int64()),
            "best_cached_tokens": pa.array(o.best_cached, pa.int64()),
            "queue_wait_s": pa.array(o.start_s - w.arrival_s, pa.float64()),
            "ttft_s": pa.array(o.first_token_s - w.arrival_s, pa.float64()),
            "prefill_tokens": pa.array(w.prompt_tokens - o.cached_tokens, pa.int64()),
            "prefill_s": pa.array(o.prefill_s, pa.float64()),
            "decision": pa.array(reasons.tolist(), pa.string()),
            "spilled": pa.array(o.routed_cached < o.best_cached, pa.bool_()),
            "measured": pa.array(w.measured, pa.bool_()),
        }
    )


def timeline_table(w: Workload, o: Outcome, bucket_s: float) -> pa.Table:
    """Per time bucket of arrivals: hit rate, mean TTFT and queue wait, spills (restart storms show here)."""
    b = np.floor(w.arrival_s / bucket_s).astype(np.int64) if w.n else np.zeros(0, np.int64)
    nb = int(b.max()) + 1 if w.n else 0
    reqs = np.bincount(b, minlength=nb)
    prompt = np.bincount(b, weights=w.prompt_tokens, minlength=nb)
    cached = np.bincount(b, weights=o.cached_tokens, minlength=nb)
    ttft = np.bincount(b, weights=o.first_token_s - w.arrival_s, minlength=nb)
    wait = np.bincount(b, weights=o.start_s - w.arrival_s, minlength=nb)
    spill = np.bincount(b, weights=(o.routed_cached < o.best_cached).astype(np.float64), minlength=nb)
    keep = reqs > 0
    d = np.maximum(reqs, 1)
    return pa.table(
        {
            "policy": pa.array([o.policy] * int(keep.sum()), pa.string()),
            "t_start_s": pa.array((np.arange(nb) * bucket_s)[keep], pa.float64()),
            "requests": pa.array(reqs[keep], pa.int64()),
            "hit_rate_token_weighted": pa.array((cached / np.maximum(prompt, 1))[keep], pa.float64()),
            "ttft_mean_s": pa.array((ttft / d)[keep], pa.float64()),
            "queue_wait_mean_s": pa.array((wait / d)[keep], pa.float64()),
            "spill_rate": pa.array((spill / d)[keep], pa.float64()),
        }
    )

# Metrics of the KV tiers and of disaggregated prefill/decode, added only when a replay had them: a replay
# without tiers or a decode pool gets none of these keys or columns, so its tables stay as they were. Cached
# tokens by tier sum to the request's cached tokens; recomputed = prompt - cached. Pool utilisations are
# time averages over the replay: prefill = busy prefill-lane seconds per prefill worker, decode = running
# sequences per `max_num_seqs` and held KV blocks per usable block of each decode worker.
PREFILL_TARGET_UTILIZATION = 0.8  # "prefill GPUs needed" keeps the pool's busy fraction at or below this


def tier_summary(w: Workload, o: Outcome, tensor_parallel: int) -> dict[str, Any]:
    """Per-policy tier and disaggregation keys beside `summarize`'s, over the measured requests ({} for a
    plain replay)."""
    t, m = o.tiers, w.measured
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
        out.update(_pd_summary(o, m, tensor_parallel))
    return out


def _pd_summary(o: Outcome, m: np.ndarray, tp: int) -> dict[str, Any]:
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


def tier_columns(w: Workload, o: Outcome) -> dict[str, pa.Array]:
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
