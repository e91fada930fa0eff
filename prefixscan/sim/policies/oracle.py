"""Oracle: least predicted TTFT with exact knowledge of every cache and queue at routing time.

A reference point, not a deployable router: it sees the engines' true resident blocks and backlogs.
It is not clairvoyant about future arrivals, so it is a strong baseline rather than an optimum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import CACHEDV, FSCR0, G_NACT
from prefixscan.sim.fast.shared import PolicyArrays, argmin_active, f64, fixed_reasons, ranked
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req
from prefixscan.sim.policies.cost_based import predicted_cost, predicted_cost_kernel


@dataclass(frozen=True)
class OracleParams:
    kv_risk_s: float = 1.0


class Oracle(Policy):
    name = "oracle"
    Params = OracleParams
    knowledge = "exact"

    def choose(self, req: Req, view: ClusterView) -> Decision:
        cached = view.cached_tokens(req)
        _, score = predicted_cost(req, view, cached, 0.0, self.params.kv_risk_s)
        r = view.argmin_active(score)
        return Decision(r, view.ranked(score), int(cached[r]), "least-predicted-ttft")


CODE = 11


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    return PolicyArrays(CODE, fixed_reasons(("least-predicted-ttft",)), pf=f64(policy.params.kv_risk_s))


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    nact = g[G_NACT]
    predicted_cost_kernel(now, nbi, prompt, ci, cf, g, fp, 0.0, pf[0])
    r = argmin_active(cf, FSCR0, ci, nact)
    return r, 0, ci[CACHEDV, r], ranked(cf, FSCR0, 1.0, ci, nact, 3, cand)
