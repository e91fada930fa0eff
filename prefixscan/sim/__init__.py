"""Cluster replay: what each routing policy would capture on N replicas with finite KV memory.

`simulate(run_or_table, config)` replays the requests table of a run (or any table with its columns)
once per policy and returns a `SimResult` holding headline metrics and the sim tables. Everything is
deterministic for a given table, config and seed. The replay is compiled (`sim/fast/`); `engine=
"reference"` (or PREFIXSCAN_SIM_ENGINE=reference) runs the Python reference engine instead, with
identical results.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from prefixscan.errors import UsageError
from prefixscan.sim.config import ReplicaEvent, SimConfig
from prefixscan.sim.fast import run_replay
from prefixscan.sim.metrics import (
    HEADLINE,
    colocated_comparison,
    decision_table,
    replica_table,
    summarize,
    tier_columns,
    tier_summary,
    timeline_table,
)
from prefixscan.sim.outcome import _capacity
from prefixscan.sim.policies import POLICIES, make_policy, resolve_names
from prefixscan.sim.timing import ServingModel, from_coeffs, from_cost_model, preble_fit
from prefixscan.sim.workload import Workload, build_workload

__all__ = ["HEADLINE", "POLICIES", "ReplicaEvent", "SimConfig", "SimResult", "serving_model", "simulate"]

TABLES = ("sim_policies", "sim_replicas", "sim_decisions", "sim_timeline", "sim_tier_capacity")


@dataclass
class SimResult:
    """Headline metrics per policy plus the tables `simulate` writes into the run directory."""

    config: dict[str, Any]
    info: dict[str, Any]
    policies: dict[str, dict[str, Any]]
    tables: dict[str, pa.Table] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    engines: dict[str, str] = field(default_factory=dict)  # policy -> "fast" | "reference" (what ran)

    def to_json(self) -> dict[str, Any]:
        """Stable machine-readable form: {"policies": {NAME: {metric: value}}, "workload", "config"}.

        A dict, like every other result's `to_json()`; `dumps()` gives the canonical text.
        """
        out: dict[str, Any] = json.loads(self.dumps())
        return out

    def dumps(self) -> str:
        """The JSON text `prefixscan simulate --json` prints (sorted keys, no NaN)."""
        doc = {"policies": self.policies, "workload": self.info, "config": self.config}
        return json.dumps(doc, sort_keys=True, default=_json_default, allow_nan=False)

    def save(self, run_path: str | os.PathLike[str], name: str = "default") -> Path:
        """Write the sim tables into a run directory under `name` (replacing only a simulation of that
        name; prefixscan.run.simstore) and record the config in its manifest. Returns where the tables are."""
        from prefixscan.run.simstore import save

        info = {"config": self.config, "workload": self.info, "policies": self.policies}
        return save(run_path, self.tables, info, name)

    @classmethod
    def load(cls, run_path: str | os.PathLike[str], name: str | None = None) -> SimResult:
        """Re-open a saved simulation (`name`; default: `default`, else the most recent) for re-rendering."""
        from prefixscan.run.load import load_run

        run = load_run(run_path, simulation=name)
        sec = run.manifest.get("simulate")
        if not sec or run.simulation is None:
            raise UsageError(f"run {run_path} has no simulation; run `prefixscan simulate {run_path}` first")
        tables = {t: run.table(t) for t in TABLES if run.has(t)}
        pols = sec["policies"]
        if "sim_policies" in tables:  # the manifest sorts keys; the table keeps the run's order
            order = [p for p in tables["sim_policies"]["policy"].to_pylist() if p in pols]
            pols = {p: pols[p] for p in order + sorted(set(pols) - set(order))}
        return cls(sec["config"], sec["workload"], pols, tables)


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    """NaN/inf -> None so JSON stays strict."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def serving_model(cfg: SimConfig) -> ServingModel:
    """The serving-time model the config asks for."""
    if cfg.prefill_model == "preble":
        pm = preble_fit()
    elif cfg.prefill_model == "coeffs":
        pm = from_coeffs(cfg.prefill_coeffs)
    elif cfg.prefill_model == "profile":
        pm = dataclasses.replace(from_coeffs(cfg.prefill_coeffs), source=f"profile:{cfg.timing_profile}")
    else:
        pm = from_cost_model(cfg.model, cfg.gpu, cfg.dtype, cfg.mfu, cfg.tensor_parallel)
    return ServingModel(pm, cfg.tpot_s, cfg.decode_slowdown, cfg.token_budget)


def _source(run_or_table: Any, block_size: int | None, hit_rule: str | None) -> tuple[pa.Table, int, str]:
    """(requests table, block size, hit rule): the arguments when given, else the run manifest's `config`
    (for a bare table: 16 / "vllm")."""
    mcfg: dict[str, Any] = {}
    if isinstance(run_or_table, pa.Table):
        table = run_or_table
    else:
        from prefixscan.run.load import Run, load_run

        run = run_or_table if isinstance(run_or_table, Run) else load_run(run_or_table)
        table, mcfg = run.table("requests"), run.manifest.get("config", {})
    return table, int(block_size or mcfg.get("block_size") or 16), str(hit_rule or mcfg.get("hit_rule") or "vllm")


def _workload(table: pa.Table, bs: int, rule: str, cfg: SimConfig) -> Workload:
    """The replayable workload of a requests table under one config (salting, time scaling, warm-up): the
    config fields `build_workload` takes, by their names."""
    opts = ("default_output_tokens", "isolate_tenants", "rate_scale", "target_rps", "warmup_s")
    return build_workload(table, bs, rule, **{k: getattr(cfg, k) for k in opts})


def simulate(
    run_or_table: Any,
    config: SimConfig | None = None,
    *,
    block_size: int | None = None,
    hit_rule: str | None = None,
    progress: Any = None,
    engine: str | None = None,
) -> SimResult:
    """Replay a run's requests (a run path, `Run`, or a requests table) once per policy.

    `block_size` / `hit_rule` default to the run manifest's `config` (for a bare table: 16 / "vllm").
    `progress(name, i, total)` is called before each policy when given. `engine`: "auto" (default:
    compiled where supported), "fast" (compiled or an error) or "reference" (the Python engine); the
    default comes from $PREFIXSCAN_SIM_ENGINE when set.
    """
    cfg = config or SimConfig()
    table, bs, rule = _source(run_or_table, block_size, hit_rule)
    w = _workload(table, bs, rule, cfg)
    serving = serving_model(cfg)
    capacity = _capacity(cfg, w)
    names = resolve_names(list(cfg.policies))
    unknown = {p for p, _, _ in cfg.policy_params} - set(POLICIES)
    if unknown:
        raise UsageError(f"--param names unknown policy {', '.join(sorted(unknown))}")
    summaries: dict[str, dict[str, Any]] = {}
    parts: dict[str, list[pa.Table]] = {t: [] for t in TABLES[1:]}
    timings: dict[str, float] = {}
    engines: dict[str, str] = {}
    span = float(w.arrival_s[-1]) if w.n else 0.0
    bucket = _nice_bucket(span)
    for j, name in enumerate(names):
        if progress is not None:
            progress(name, j, len(names))
        pol = make_policy(name, cfg.params_for(name), cfg.seed)
        t0 = time.perf_counter()
        out, engines[name] = run_replay(w, pol, cfg, serving, capacity, engine)
        timings[name] = time.perf_counter() - t0
        s = _clean(summarize(w, out, serving))
        if out.tiers:
            s.update(_clean(tier_summary(w, out, cfg.tensor_parallel)))
        s["params"] = {k: getattr(pol.params, k) for k in getattr(pol.params, "__dataclass_fields__", {})}
        summaries[name] = s
        parts["sim_replicas"].append(replica_table(w, out, serving))
        parts["sim_timeline"].append(timeline_table(w, out, bucket))
        if cfg.decision_log:
            log = decision_table(w, out)
            for col, values in tier_columns(w, out).items():
                log = log.append_column(col, values)
            parts["sim_decisions"].append(log)
    more = _Replays(table, cfg, bs, rule, names, serving, capacity, engine)
    if cfg.disaggregated and cfg.compare_colocated:
        more.colocated(w, summaries)
    if cfg.compare_isolation:
        more.isolation_cost(summaries)
    rows = [
        {
            "policy": n,
            **{k: v for k, v in s.items() if k != "params"},
            "params": json.dumps(s["params"], sort_keys=True),
        }
        for n, s in summaries.items()
    ]
    keys = list(dict.fromkeys(k for row in rows for k in row))  # union: policy-specific keys included
    tables = {"sim_policies": pa.Table.from_pylist([{k: row.get(k) for k in keys} for row in rows])}
    for t, lst in parts.items():
        if lst:
            tables[t] = pa.concat_tables(lst)
    if cfg.tier_sweep:
        tables["sim_tier_capacity"] = more.tier_sweep()
    info = {
        "requests": w.n,
        "distinct_blocks": w.n_unique,
        "block_size": bs,
        "hit_rule": rule,
        "kv_blocks_per_replica": capacity,
        "unbounded_kv": cfg.unbounded_kv,
        "prefill_model": serving.prefill.source,
        "span_s": span,
        "timeline_bucket_s": bucket,
        "measured_requests": int(w.measured.sum()),
        "ideal_hit_rate_token_weighted": (
            float(w.ideal_cached.sum() / w.prompt_tokens.sum()) if w.prompt_tokens.sum() else None
        ),
    }
    return SimResult(cfg.to_dict(), info, summaries, tables, timings, engines)


@dataclass
class _Replays:
    """What the comparisons set beside the main replay share: the call's table, config and settings."""

    table: pa.Table
    cfg: SimConfig
    bs: int
    rule: str
    names: list[str]
    serving: ServingModel
    capacity: int
    engine: str | None

    def summary(self, w: Workload, name: str, cfg: SimConfig) -> dict[str, Any]:
        """One more replay of policy `name` under a variant of the fleet (`cfg`), summarised."""
        pol = make_policy(name, cfg.params_for(name), cfg.seed)
        out, _ = run_replay(w, pol, cfg, self.serving, self.capacity, self.engine)
        return _clean(summarize(w, out, self.serving))

    def isolation_cost(self, summaries: dict[str, dict[str, Any]]) -> None:
        """Replay each policy with tenant isolation flipped; add shared-vs-isolated deltas to its summary."""
        flipped = dataclasses.replace(self.cfg, isolate_tenants=not self.cfg.isolate_tenants)
        w2 = _workload(self.table, self.bs, self.rule, flipped)
        for name in self.names:
            other = self.summary(w2, name, flipped)
            mine = summaries[name]
            shared, iso = (other, mine) if self.cfg.isolate_tenants else (mine, other)
            hs, hi = shared["hit_rate_token_weighted"], iso["hit_rate_token_weighted"]
            ts, ti = shared["ttft_p95_s"], iso["ttft_p95_s"]
            mine["isolation_cost_hit_rate"] = hs - hi if hs is not None and hi is not None else None
            mine["isolation_cost_prefill_tokens"] = iso["prefill_tokens"] - shared["prefill_tokens"]
            mine["isolation_cost_ttft_p95_s"] = ti - ts if ti is not None and ts is not None else None

    def colocated(self, w: Workload, summaries: dict[str, dict[str, Any]]) -> None:
        """Replay each policy on a co-located fleet of prefill + decode replicas (same traffic, same tiers)
        and add its headline to the disaggregated summary, `colocated_*`."""
        n = self.cfg.replicas + self.cfg.decode_replicas
        colo = dataclasses.replace(self.cfg, replicas=n, decode_replicas=0)
        for name in self.names:
            colocated_comparison(summaries[name], self.summary(w, name, colo), n)

    def tier_sweep(self) -> pa.Table:
        """The capacity view (`--tier-sweep`) for the first deployable policy (the oracle is a reference, not
        a router): hit rate against GPU KV size and against the second tier's size. The policy is replayed
        over a grid: GPU KV blocks per replica at fractions / multiples of the configured size, times a
        second tier (the host tier, or the shared store when only that is configured) at multiples of the
        GPU size (SGLang's `--hicache-ratio` is the host/GPU ratio; 0 = no second tier). Each cell is a full
        replay, so the view includes routing, queueing and eviction, not only an LRU stack distance; the rows
        say where reuse is captured (GPU / host / shared) and what recomputation is left."""
        cfg = self.cfg
        name = next((n for n in self.names if n != "oracle"), self.names[0])
        has_shared = bool(cfg.shared_kv_blocks or cfg.shared_kv_gib)
        axis = "shared" if has_shared and not (cfg.host_kv_blocks or cfg.host_kv_gib) else "host"
        rows = []
        for gf in GPU_FACTORS:
            gpu = max(2, int(round(self.capacity * gf)))
            for ratio in TIER_RATIOS:
                tier = int(round(gpu * ratio))
                sizes: dict[str, Any] = {f"{axis}_kv_blocks": tier, f"{axis}_kv_gib": 0.0}
                # the router sees tiers when one is left to see: this one, or the shared store beside the host
                sizes["router_sees_tiers"] = cfg.router_sees_tiers and (tier > 0 or (axis == "host" and has_shared))
                c = dataclasses.replace(cfg, kv_blocks=gpu, unbounded_kv=False, policies=(name,), decision_log=False,
                                        compare_isolation=False, decode_replicas=0, tier_sweep=False, **sizes)
                s = simulate(self.table, c, block_size=self.bs, hit_rule=self.rule, engine=self.engine).policies[name]
                rows.append({
                    "policy": name,
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


GPU_FACTORS = (0.25, 0.5, 1.0, 2.0)  # the capacity view's GPU sizes, times the configured one
TIER_RATIOS = (0.0, 1.0, 2.0, 4.0, 8.0)  # its second-tier sizes, times the GPU size


def _nice_bucket(span: float) -> float:
    """About 50 timeline buckets, rounded to 1/2/5 x 10^k seconds."""
    if span <= 0:
        return 1.0
    raw = span / 50
    mag = 10 ** math.floor(math.log10(raw))
    return float(next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw))
