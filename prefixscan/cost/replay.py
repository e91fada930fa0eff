"""Round robin and the router priced from a replay of the run's own requests, at the scenario asked.

Analytic round robin (hit chance 1/replicas) misses the common case where one shared system prompt ends
up cached on every replica, and can overstate the saving several times over. So whenever a run exists
the baselines come from `prefixscan.sim`: the saved simulation when it ran this very scenario (replicas,
KV blocks per replica, request rate), else a replay on the fly (round robin plus the router policies).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from prefixscan.cost.measure import MeasuredWorkload
from prefixscan.cost.options import ROUTER_POLICIES
from prefixscan.cost.scenario import ScenarioSpec, sim_rate
from prefixscan.cost.verdict import adoptable


@dataclass(frozen=True)
class PolicyHit:
    """One replayed policy: cluster-wide token-weighted hit rate, per-request hit share, TTFT and balance."""

    policy: str
    hit_rate_token_weighted: float
    hit_share_requests: float | None  # requests with any cached token / measured requests
    capture_of_ideal: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    imbalance_max_mean: float | None
    row: dict[str, Any]  # the simulator's whole summary row (the report's policy tables read it)


@dataclass(frozen=True)
class Baselines:
    """Where round robin and the router come from: "saved simulation", "replay" or "analytic"."""

    basis: str
    detail: str
    policies: tuple[PolicyHit, ...]

    def get(self, name: str) -> PolicyHit | None:
        return next((p for p in self.policies if p.policy == name), None)

    @property
    def round_robin(self) -> PolicyHit | None:
        return self.get("round_robin")

    @property
    def router(self) -> PolicyHit | None:
        """The best adoptable policy replayed (baselines and the oracle bound never count)."""
        cands = [p for p in self.policies if adoptable(p.policy)]
        return max(cands, key=lambda p: (p.hit_rate_token_weighted, p.policy), default=None)


def finite(x: Any) -> float | None:
    """A number, or None when it is absent, NaN or infinite."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def policy_hit(row: dict[str, Any]) -> PolicyHit | None:
    """A simulator summary row as a PolicyHit (None for a policy that served no prompt tokens)."""
    h = finite(row.get("hit_rate_token_weighted"))
    if h is None:
        return None
    reqs = row.get("requests") or 0
    warm = (row.get("warm_requests") or 0) + (row.get("partial_requests") or 0)
    share = warm / reqs if reqs and row.get("warm_requests") is not None else None
    return PolicyHit(str(row["policy"]), h, share, finite(row.get("capture_of_ideal")), finite(row.get("ttft_p50_s")),
                     finite(row.get("ttft_p95_s")), finite(row.get("imbalance_max_mean")), dict(row))


def saved_mismatch(m: MeasuredWorkload, spec: ScenarioSpec) -> str | None:
    """None when the saved simulation replayed exactly this scenario, else what differs."""
    cfg, wl = m.sim_config, m.sim_workload or {}
    if not cfg:
        return "the run has no saved simulation"
    if cfg.get("replicas") != spec.replicas:
        return f"the saved simulation ran {cfg.get('replicas')} replicas, this scenario has {spec.replicas}"
    if wl.get("unbounded_kv") or wl.get("kv_blocks_per_replica") != spec.kv_blocks_per_replica:
        return (f"the saved simulation gave each replica {wl.get('kv_blocks_per_replica')} KV blocks, this "
                f"scenario {spec.kv_blocks_per_replica}")
    if cfg.get("events") or cfg.get("isolate_tenants"):
        return "the saved simulation replayed replica events or tenant isolation"
    rate = sim_rate(m)
    rate = m.rps if rate is None else rate
    if spec.rps is None or not math.isclose(rate, spec.rps, rel_tol=1e-9):
        return f"the saved simulation replayed {rate:.4g} req/s, this scenario {spec.rps:.4g} req/s"
    return None


def _saved_policies(run_dir: str | os.PathLike[str]) -> tuple[PolicyHit, ...]:
    from prefixscan.run.load import load_run

    run = load_run(run_dir)
    if not run.has("sim_policies"):
        return ()
    rows = run.table("sim_policies").to_pylist()
    return tuple(p for p in (policy_hit(r) for r in rows) if p is not None)


def sim_config(spec: ScenarioSpec, m: MeasuredWorkload, policies: tuple[str, ...], **over: Any) -> Any:
    """The SimConfig that replays this scenario (the same replica memory and rate the estimate prices)."""
    from prefixscan.errors import UsageError
    from prefixscan.hardware.models import get_model
    from prefixscan.sim import SimConfig

    try:
        catalogued = get_model(spec.model.name).name == spec.model.name
    except UsageError:  # a --model-config model: serving times from Preble's fit instead
        catalogued = False
    target = spec.rps if spec.rps is not None and spec.rps_source != "measured" else None
    kw: dict[str, Any] = dict(
        replicas=spec.replicas, policies=policies, kv_blocks=max(1, spec.kv_blocks_per_replica),
        model=spec.model.name if catalogued else "llama-3.1-8b", gpu=spec.gpu.name, dtype=spec.dtype,
        tensor_parallel=spec.tensor_parallel, gpu_memory_utilization=spec.gpu_memory_utilization,
        mfu=spec.mfu, prefill_model="cost" if catalogued else "preble", target_rps=target,
        decision_log=False)
    kw.update(over)
    return SimConfig(**kw)


def replay(run_dir: str | os.PathLike[str], spec: ScenarioSpec, m: MeasuredWorkload,
           policies: tuple[str, ...], **over: Any) -> tuple[PolicyHit, ...]:
    """Replay the run's requests under these policies at the scenario (`over` changes SimConfig fields)."""
    from prefixscan.sim import simulate

    res = simulate(run_dir, sim_config(spec, m, policies, **over))
    rows = [{"policy": name, **s} for name, s in res.policies.items()]
    return tuple(p for p in (policy_hit(r) for r in rows) if p is not None)


def baselines(run_dir: str | os.PathLike[str], m: MeasuredWorkload, spec: ScenarioSpec,
              router_policies: tuple[str, ...] = ROUTER_POLICIES) -> Baselines:
    """Round robin and the router from the saved simulation when it matches the scenario, else a replay."""
    mismatch = saved_mismatch(m, spec)
    if mismatch is None:
        saved = _saved_policies(run_dir)
        if any(p.policy == "round_robin" for p in saved):
            return Baselines("saved simulation", "the run's saved simulation replayed this scenario", saved)
        mismatch = "the saved simulation has no round_robin"
    if m.replayable is not None:
        return Baselines("analytic", f"cannot replay: {m.replayable}", ())
    if spec.kv_tokens_per_replica <= 0:
        return Baselines("analytic", "cannot replay: the weights leave no KV memory", ())
    pols = replay(run_dir, spec, m, ("round_robin", *router_policies))
    why = "" if mismatch == "the run has no saved simulation" else f"; {mismatch}"
    return Baselines("replay", f"replayed the run's {m.requests:,} requests at this scenario{why}", pols)
