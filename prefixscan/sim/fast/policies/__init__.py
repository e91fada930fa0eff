"""Compiled routing policies, one module per policy, each a kernel with the reference policy's exact rule.

`SETUP[name](policy, workload, slots)` turns a reference `Policy` (its frozen params, seed) into the
arrays its kernel reads; `dispatch.choose` calls the kernel by the policy's integer code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefixscan.sim.fast.policies import (
    chwbl,
    cost_based,
    dynamo_kv,
    least_loaded,
    llmd_weighted,
    oracle,
    preble_e2,
    prefix_hash,
    random_policy,
    round_robin,
    session_affinity,
    sglang_cache_aware,
)
from prefixscan.sim.fast.policies.base import PolicyArrays

SETUP: dict[str, Callable[[Any, Any, int], PolicyArrays]] = {
    "round_robin": round_robin.setup,
    "random": random_policy.setup,
    "least_loaded": least_loaded.setup,
    "session_affinity": session_affinity.setup,
    "chwbl": chwbl.setup,
    "prefix_hash": prefix_hash.setup,
    "sglang_cache_aware": sglang_cache_aware.setup,
    "dynamo_kv": dynamo_kv.setup,
    "llmd_weighted": llmd_weighted.setup,
    "preble_e2": preble_e2.setup,
    "cost_based": cost_based.setup,
    "oracle": oracle.setup,
}

__all__ = ["SETUP", "PolicyArrays"]
