"""Compiled `chwbl` (policies/chwbl.py): first replica clockwise under the bounded load ceil(c(m+1)/n)."""

from __future__ import annotations

import math
from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, G_NACT, INFLIGHT, SCR0
from prefixscan.sim.fast.policies.base import PolicyArrays, f64, i64, ring_policy
from prefixscan.sim.fast.policies.common import (
    RING_HEADER,
    RING_M,
    RING_N,
    ring_next,
    ring_start,
    ring_sync,
    ring_unmark,
)

CODE = 4
SPILLS = RING_HEADER  # si: bound spills; sf[0]: the largest load/bound ratio produced


def reason(code: int) -> str:
    return "home" if code == 0 else f"bounded-load-skip-{code}"


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    pa = ring_policy(CODE, reason, policy, w, slots, p.key, state=i64(0))
    pa.pf = f64(p.c)
    pa.stats = lambda sf, si: {"max_load_over_bound": float(sf[0]), "bound_spills": int(si[SPILLS])}
    return pa


@njit(cache=True)
def choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    ring_sync(ci, g, si, pu)
    nact = g[G_NACT]
    m = 0
    for a in range(nact):
        m += ci[INFLIGHT, ci[ACT, a]]
    bound = math.ceil(pf[0] * (m + 1) / nact)
    pos = ring_start(ci, si, pu, pu[i])
    walked = ci[SCR0]
    nw = 0
    for j in range(si[RING_M]):
        r = ring_next(ci, si, pos, j)
        if r < 0:
            continue
        walked[nw] = r
        nw += 1
        if ci[INFLIGHT, r] < bound or nw == si[RING_N]:
            break
    ring_unmark(ci, walked, nw)
    r = walked[nw - 1]
    ratio = (ci[INFLIGHT, r] + 1) / bound
    if ratio > sf[0]:
        sf[0] = ratio
    if nw > 1:
        si[SPILLS] += 1
    nc = 0
    for j in range(max(nw - 3, 0), nw):
        cand[nc] = walked[j]
        nc += 1
    return r, nw - 1, ci[CACHEDV, r], nc
