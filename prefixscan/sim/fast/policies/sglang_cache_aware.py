"""Compiled `sglang_cache_aware` (policies/sglang_cache_aware.py): imbalance, then cache match, then tree size."""

from __future__ import annotations

from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, FSCR0, G_NACT, INFLIGHT, KB, VCOUNT
from prefixscan.sim.fast.policies.base import PolicyArrays, f64, fixed_reasons, i64
from prefixscan.sim.fast.policies.common import argmin_active, ranked

CODE = 6


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    pa = PolicyArrays(CODE, fixed_reasons(("imbalanced-least-load", "cache-match", "smallest-tree")))
    pa.pf = f64(p.cache_threshold, p.balance_rel_threshold)
    pa.pi = i64(p.balance_abs_threshold)
    return pa


@njit(cache=True)
def choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    nact = g[G_NACT]
    lo = hi = ci[INFLIGHT, ci[ACT, 0]]
    for a in range(nact):
        r = ci[ACT, a]
        lo, hi = min(lo, ci[INFLIGHT, r]), max(hi, ci[INFLIGHT, r])
        cf[FSCR0, r] = float(ci[INFLIGHT, r])
    if hi - lo > pi[0] and hi > lo * pf[1]:
        r = argmin_active(cf, FSCR0, ci, nact)
        return r, 0, ci[CACHEDV, r], ranked(cf, FSCR0, 1.0, ci, nact, 3, cand)
    best = ci[ACT, 0]
    for a in range(1, nact):
        if ci[KB, ci[ACT, a]] > ci[KB, best]:
            best = ci[ACT, a]
    if float(ci[CACHEDV, best]) / max(prompt, 1) > pf[0]:
        for a in range(nact):
            cf[FSCR0, ci[ACT, a]] = float(ci[CACHEDV, ci[ACT, a]])
        return best, 1, ci[CACHEDV, best], ranked(cf, FSCR0, -1.0, ci, nact, 3, cand)
    for a in range(nact):
        cf[FSCR0, ci[ACT, a]] = float(ci[VCOUNT, ci[ACT, a]])  # tree sizes; zero unless the view is approximate
    r = argmin_active(cf, FSCR0, ci, nact)
    return r, 2, ci[CACHEDV, r], ranked(cf, FSCR0, 1.0, ci, nact, 3, cand)
