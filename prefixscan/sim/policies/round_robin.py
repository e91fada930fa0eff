"""Round robin over the active replicas: the cache-blind baseline (~1/N of same-conversation reuse)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, G_NACT
from prefixscan.sim.fast.shared import PolicyArrays, fixed_reasons
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req


@dataclass(frozen=True)
class RoundRobinParams:
    """No parameters: the order is the active replica list."""


class RoundRobin(Policy):
    name = "round_robin"
    Params = RoundRobinParams

    def __init__(self, params: RoundRobinParams, seed: int) -> None:
        super().__init__(params, seed)
        self.turn = 0

    def choose(self, req: Req, view: ClusterView) -> Decision:
        idx = view.active_idx
        r = int(idx[self.turn % len(idx)])
        self.turn += 1
        return Decision(r, (r,), view.cached_at(req, r), "round-robin")


CODE = 0


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    return PolicyArrays(CODE, fixed_reasons(("round-robin",)))


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    r = ci[ACT, si[0] % g[G_NACT]]
    si[0] += 1
    cand[0] = r
    return r, 0, ci[CACHEDV, r], 1
