"""Compiled `dynamo_kv` (policies/dynamo_kv.py): min weight * uncached blocks + active blocks, or softmax."""

from __future__ import annotations

import math
from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, FSCR0, FSCR1, G_NACT, G_UPTR, KB, LOAD_BLOCKS
from prefixscan.sim.fast.policies.base import PolicyArrays, f64, fixed_reasons
from prefixscan.sim.fast.policies.common import argmin_active, ranked

CODE = 7


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    pa = PolicyArrays(CODE, fixed_reasons(("min-cost", "min-cost-load", "softmax-sample")))
    pa.pf = f64(p.overlap_score_weight, p.router_temperature)
    return pa


@njit(cache=True)
def softmax_sample(ci, cf, nact, temperature, uni, g):
    """dynamo_kv.softmax_sample over cf[FSCR0]: weights exp(-(cost - min) / span / T), one uniform."""
    lo = hi = cf[FSCR0, ci[ACT, 0]]
    for a in range(nact):
        c = cf[FSCR0, ci[ACT, a]]
        lo, hi = min(lo, c), max(hi, c)
    scale = hi - lo if hi - lo > 0 else 1.0
    total = 0.0
    for a in range(nact):
        cf[FSCR1, a] = math.exp(-(cf[FSCR0, ci[ACT, a]] - lo) / scale / temperature)
        total += cf[FSCR1, a]
    target = uni[g[G_UPTR]] * total
    g[G_UPTR] += 1
    cum = 0.0
    for a in range(nact):
        cum += cf[FSCR1, a]
        if cum > target:
            return ci[ACT, a]
    return ci[ACT, nact - 1]


@njit(cache=True)
def choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    nact = g[G_NACT]
    kmax = ci[KB, ci[ACT, 0]]
    for a in range(nact):
        r = ci[ACT, a]
        cf[FSCR0, r] = pf[0] * (nbi - ci[KB, r]) + ci[LOAD_BLOCKS, r]
        kmax = max(kmax, ci[KB, r])
    if pf[1] > 0:
        r = softmax_sample(ci, cf, nact, pf[1], uni, g)
        reason = 2
    else:
        r = argmin_active(cf, FSCR0, ci, nact)
        reason = 0 if ci[KB, r] == kmax else 1
    return r, reason, ci[CACHEDV, r], ranked(cf, FSCR0, 1.0, ci, nact, 3, cand)
