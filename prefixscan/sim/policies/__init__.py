"""Routing policies, one module each: the readable reference (`base.Policy.choose(req, view) -> Decision`)
and, beside it, its compiled form, which `sim.fast` runs: `setup(policy, w, slots)` turns the frozen params
and seed into the arrays `kernel` reads, and `kernel` is the same rule over the replay's arrays. `POLICIES`
is the one registry: its order is the `--policies all` order and each module's `CODE` (tests/test_sim_fast.py)."""

from __future__ import annotations

from typing import Any

from prefixscan.errors import UsageError
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req, coerce_params
from prefixscan.sim.policies.chwbl import Chwbl
from prefixscan.sim.policies.cost_based import CostBased
from prefixscan.sim.policies.dynamo_kv import DynamoKv
from prefixscan.sim.policies.least_loaded import LeastLoaded
from prefixscan.sim.policies.llmd_weighted import LlmdWeighted
from prefixscan.sim.policies.oracle import Oracle
from prefixscan.sim.policies.preble_e2 import PrebleE2
from prefixscan.sim.policies.prefix_hash import PrefixHash
from prefixscan.sim.policies.random_policy import RandomPolicy
from prefixscan.sim.policies.round_robin import RoundRobin
from prefixscan.sim.policies.session_affinity import SessionAffinity
from prefixscan.sim.policies.sglang_cache_aware import SglangCacheAware

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        RoundRobin,
        RandomPolicy,
        LeastLoaded,
        SessionAffinity,
        Chwbl,
        PrefixHash,
        SglangCacheAware,
        DynamoKv,
        LlmdWeighted,
        PrebleE2,
        CostBased,
        Oracle,
    )
}

__all__ = ["POLICIES", "ClusterView", "Decision", "Policy", "Req", "make_policy", "resolve_names"]


def resolve_names(names: tuple[str, ...] | list[str]) -> list[str]:
    """Expand "all" and check names, keeping the registry order for "all"."""
    out: list[str] = []
    for raw in names:
        for name in (x.strip() for x in raw.split(",")):
            if not name:
                continue
            if name == "all":
                out.extend(n for n in POLICIES if n not in out)
            elif name in POLICIES:
                if name not in out:
                    out.append(name)
            else:
                raise UsageError(f"unknown policy {name!r}; choose from: all, {', '.join(POLICIES)}")
    if not out:
        raise UsageError("no policies given; use --policies all or a comma-separated list")
    return out


def make_policy(name: str, overrides: dict[str, Any], seed: int) -> Policy:
    """Instantiate a policy with its frozen parameters (defaults + overrides)."""
    cls = POLICIES[name]
    return cls(coerce_params(cls.Params, overrides, name), seed)
