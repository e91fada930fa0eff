"""Uniform random choice (seeded): the other cache-blind baseline."""

from __future__ import annotations

from dataclasses import dataclass

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
