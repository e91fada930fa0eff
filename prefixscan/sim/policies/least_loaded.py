"""Least loaded: fewest in-flight requests (least connections), ties broken at random (seeded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, FSCR0, G_NACT, INFLIGHT
from prefixscan.sim.fast.shared import PolicyArrays, backlog, fixed_reasons, i64, pick_best, ranked
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req


@dataclass(frozen=True)
class LeastLoadedParams:
    metric: str = "inflight"  # "inflight" (requests routed and not finished) or "backlog" (queued prefill s)


class LeastLoaded(Policy):
    name = "least_loaded"
    Params = LeastLoadedParams

    def choose(self, req: Req, view: ClusterView) -> Decision:
        load = view.backlog_s() if self.params.metric == "backlog" else view.inflight.astype(np.float64)
        idx = view.active_idx
        vals = load[idx]
        ties = idx[vals == vals.min()]
        r = view.pick(ties)
        return Decision(r, view.ranked(load), view.cached_at(req, r), "least-loaded")


CODE = 2


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    return PolicyArrays(CODE, fixed_reasons(("least-loaded",)), pi=i64(policy.params.metric == "backlog"))


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    nact = g[G_NACT]
    for a in range(nact):
        r = ci[ACT, a]
        cf[FSCR0, r] = backlog(cf, r, now) if pi[0] else float(ci[INFLIGHT, r])
    r = pick_best(cf, FSCR0, 1.0, 0.0, ci, nact, uni, g)  # the least loaded, ties at random
    return r, 0, ci[CACHEDV, r], ranked(cf, FSCR0, 1.0, ci, nact, 3, cand)
