"""Compiled `round_robin` (policies/round_robin.py): the next active replica in turn."""

from __future__ import annotations

from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, G_NACT
from prefixscan.sim.fast.policies.base import PolicyArrays, fixed_reasons

CODE = 0


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    return PolicyArrays(CODE, fixed_reasons(("round-robin",)))


@njit(cache=True)
def choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    r = ci[ACT, si[0] % g[G_NACT]]
    si[0] += 1
    cand[0] = r
    return r, 0, ci[CACHEDV, r], 1
