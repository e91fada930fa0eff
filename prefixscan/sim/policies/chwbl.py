"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, arXiv 1608.01350).

With m requests in flight over n replicas, each replica may hold at most ceil(c * (m + 1) / n); a key
walks clockwise from its hash to the first replica under that bound (docs/engines.md, 'Routers'). `stats` records
the largest load/bound ratio ever produced so tests can check the bound is never exceeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req
from prefixscan.sim.policies.ring import Ring, request_key


@dataclass(frozen=True)
class ChwblParams:
    c: float = 1.25
    key: str = "conversation"  # "conversation" (falls back to prefix) or "prefix"
    prefix_blocks: int = 4
    vnodes: int = 100


class Chwbl(Policy):
    name = "chwbl"
    Params = ChwblParams

    def __init__(self, params: ChwblParams, seed: int) -> None:
        super().__init__(params, seed)
        if params.c < 1:
            from prefixscan.errors import UsageError

            raise UsageError(f"chwbl.c must be >= 1, got {params.c}")
        self.ring = Ring(params.vnodes, seed)
        self.stats = {"max_load_over_bound": 0.0, "bound_spills": 0}

    def choose(self, req: Req, view: ClusterView) -> Decision:
        self.ring.sync(view.active_idx, view.version)
        idx = view.active_idx
        m = int(view.inflight[idx].sum())
        bound = math.ceil(self.params.c * (m + 1) / len(idx))
        walked = []
        for r in self.ring.walk(
            request_key(req, self.params.key, self.params.prefix_blocks, view.workload.block_keys)
        ):
            walked.append(r)
            if view.inflight[r] < bound:
                break
        r = walked[-1]
        ratio = (int(view.inflight[r]) + 1) / bound
        self.stats["max_load_over_bound"] = max(self.stats["max_load_over_bound"], ratio)
        if len(walked) > 1:
            self.stats["bound_spills"] += 1
        reason = "home" if len(walked) == 1 else f"bounded-load-skip-{len(walked) - 1}"
        return Decision(r, tuple(walked[-3:]), view.cached_at(req, r), reason)
