"""Least loaded: fewest in-flight requests (least connections), ties broken at random (seeded)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
