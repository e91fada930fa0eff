"""Prefix hashing with hot-prefix replication.

The key is the chain id of the first K blocks, consistently hashed to a home replica. A prefix seen at
least `hot_requests` times in the current or previous `window_s` window is hot and spreads over the
first `replicas_k` replicas of its ring walk (least in-flight among them), so one popular system prompt
does not pin all its traffic to a single replica.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req
from prefixscan.sim.policies.ring import Ring, request_key


@dataclass(frozen=True)
class PrefixHashParams:
    prefix_blocks: int = 4
    replicas_k: int = 2
    hot_requests: int = 50
    window_s: float = 60.0
    vnodes: int = 100


class PrefixHash(Policy):
    name = "prefix_hash"
    Params = PrefixHashParams

    def __init__(self, params: PrefixHashParams, seed: int) -> None:
        super().__init__(params, seed)
        self.ring = Ring(params.vnodes, seed)
        self.window = -1
        self.cur: dict[int, int] = {}
        self.prev: dict[int, int] = {}

    def choose(self, req: Req, view: ClusterView) -> Decision:
        p = self.params
        self.ring.sync(view.active_idx, view.version)
        w = int(view.now // p.window_s)
        if w != self.window:
            self.prev = self.cur if w == self.window + 1 else {}
            self.cur = {}
            self.window = w
        key = request_key(req, "prefix", p.prefix_blocks, view.workload.block_keys)
        self.cur[key] = self.cur.get(key, 0) + 1
        hot = max(self.cur[key], self.prev.get(key, 0)) >= p.hot_requests
        if not hot or p.replicas_k <= 1:
            r = self.ring.owner(key)
            return Decision(r, (r,), view.cached_at(req, r), "prefix-home")
        group = []
        for r in self.ring.walk(key):
            group.append(r)
            if len(group) == p.replicas_k:
                break
        r = min(group, key=lambda x: (int(view.inflight[x]), group.index(x)))
        return Decision(r, tuple(group), view.cached_at(req, r), "hot-prefix-replica")
