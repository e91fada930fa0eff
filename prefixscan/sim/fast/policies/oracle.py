"""Compiled `oracle` (policies/oracle.py): least predicted TTFT with exact caches and backlogs."""

from __future__ import annotations

from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import CACHEDV, FSCR0, G_NACT
from prefixscan.sim.fast.policies.base import PolicyArrays, f64, fixed_reasons
from prefixscan.sim.fast.policies.common import argmin_active, ranked
from prefixscan.sim.fast.policies.cost_based import predicted_cost

CODE = 11


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    return PolicyArrays(CODE, fixed_reasons(("least-predicted-ttft",)), pf=f64(policy.params.kv_risk_s))


@njit(cache=True)
def choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    nact = g[G_NACT]
    predicted_cost(now, nbi, prompt, ci, cf, g, fp, 0.0, pf[0])
    r = argmin_active(cf, FSCR0, ci, nact)
    return r, 0, ci[CACHEDV, r], ranked(cf, FSCR0, 1.0, ci, nact, 3, cand)
