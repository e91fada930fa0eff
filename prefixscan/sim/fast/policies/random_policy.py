"""Compiled `random` (policies/random_policy.py): a seeded uniform choice over the active replicas."""

from __future__ import annotations

from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, G_NACT
from prefixscan.sim.fast.policies.base import PolicyArrays, fixed_reasons
from prefixscan.sim.fast.policies.common import pick

CODE = 1


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    return PolicyArrays(CODE, fixed_reasons(("random",)))


@njit(cache=True)
def choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    r = pick(ci, ACT, g[G_NACT], uni, g)
    cand[0] = r
    return r, 0, ci[CACHEDV, r], 1
