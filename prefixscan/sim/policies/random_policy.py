"""Uniform random choice (seeded): the other cache-blind baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, G_NACT
from prefixscan.sim.fast.shared import PolicyArrays, fixed_reasons, pick
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req


@dataclass(frozen=True)
class RandomParams:
    """No parameters; the run's --seed drives the choice."""


class RandomPolicy(Policy):
    name = "random"
    Params = RandomParams

    def choose(self, req: Req, view: ClusterView) -> Decision:
        r = view.pick(view.active_idx)
        return Decision(r, (r,), view.cached_at(req, r), "random")


CODE = 1


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    return PolicyArrays(CODE, fixed_reasons(("random",)))


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    r = pick(ci, ACT, g[G_NACT], uni, g)
    cand[0] = r
    return r, 0, ci[CACHEDV, r], 1
