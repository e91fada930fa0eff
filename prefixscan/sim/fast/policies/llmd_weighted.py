"""Compiled `llmd_weighted` (policies/llmd_weighted.py): max queue + KV-free + prefix score, seeded ties."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, FSCR0, G_CAPACITY, G_NACT, KB, KV_AVAIL, SCR0, WAITING
from prefixscan.sim.fast.policies.base import PolicyArrays, f64, fixed_reasons
from prefixscan.sim.fast.policies.common import pick, ranked

CODE = 8


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    pf = f64(p.queue_weight, p.kv_weight, p.prefix_weight)
    return PolicyArrays(CODE, fixed_reasons(("max-weighted-score",)), pf=pf)


@njit(cache=True)
def choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    nact = g[G_NACT]
    qmax = qmin = float(ci[WAITING, ci[ACT, 0]])
    for a in range(nact):
        q = float(ci[WAITING, ci[ACT, a]])
        qmax, qmin = max(qmax, q), min(qmin, q)
    nb = max(nbi, 1)
    cap = max(g[G_CAPACITY], 1)
    smax = -np.inf
    for a in range(nact):
        r = ci[ACT, a]
        queue = (qmax - float(ci[WAITING, r])) / (qmax - qmin) if qmax > qmin else 1.0
        kv = ci[KV_AVAIL, r] / cap
        prefix = ci[KB, r] / nb
        s = pf[0] * queue + pf[1] * kv + pf[2] * prefix
        cf[FSCR0, r] = s
        smax = s if a == 0 else max(smax, s)
    nt = 0
    for a in range(nact):
        if cf[FSCR0, ci[ACT, a]] >= smax - 1e-12:
            ci[SCR0, nt] = ci[ACT, a]
            nt += 1
    r = pick(ci, SCR0, nt, uni, g)
    return r, 0, ci[CACHEDV, r], ranked(cf, FSCR0, -1.0, ci, nact, 3, cand)
