"""One compiled entry point for every policy: branch on the policy's integer code (each policy module's CODE,
its place in `sim.policies.POLICIES`) and call the module's `kernel`."""

from __future__ import annotations

from numba import njit

from prefixscan.sim.policies import (
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


@njit(cache=True)
def choose(code, i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    """Route request i: (replica, reason code, predicted cached tokens, candidates written to `cand`)."""
    if code == round_robin.CODE:
        return round_robin.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == random_policy.CODE:
        return random_policy.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == least_loaded.CODE:
        return least_loaded.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == session_affinity.CODE:
        return session_affinity.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == chwbl.CODE:
        return chwbl.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == prefix_hash.CODE:
        return prefix_hash.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == sglang_cache_aware.CODE:
        return sglang_cache_aware.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == dynamo_kv.CODE:
        return dynamo_kv.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == llmd_weighted.CODE:
        return llmd_weighted.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == preble_e2.CODE:
        return preble_e2.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == cost_based.CODE:
        return cost_based.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    return oracle.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
