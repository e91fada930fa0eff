"""Oracle: least predicted TTFT with exact knowledge of every cache and queue at routing time.

A reference point, not a deployable router: it sees the engines' true resident blocks and backlogs.
It is not clairvoyant about future arrivals, so it is a strong baseline rather than an optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req
from prefixscan.sim.policies.cost_based import predicted_cost


@dataclass(frozen=True)
class OracleParams:
    kv_risk_s: float = 1.0


class Oracle(Policy):
    name = "oracle"
    Params = OracleParams
    knowledge = "exact"

    def knowledge_mode(self, default: str) -> str:
        return "exact"

    def choose(self, req: Req, view: ClusterView) -> Decision:
        cached = view.cached_tokens(req)
        _, score = predicted_cost(req, view, cached, 0.0, self.params.kv_risk_s)
        r = view.argmin_active(score)
        return Decision(r, view.ranked(score), int(cached[r]), "least-predicted-ttft")
