"""Prefix hashing with hot-prefix replication.

The key is the chain id of the first K blocks, consistently hashed to a home replica. A prefix seen at
least `hot_requests` times in the current or previous `window_s` window is hot and spreads over the
first `replicas_k` replicas of its ring walk (least in-flight among them), so one popular system prompt
does not pin all its traffic to a single replica.

Compiled: the reference keeps per-window dicts of prefix counts; here each prefix key has a dense id and three
counters (count, the window it counts, count in the window before), rolled over lazily on first touch
in a new window, which gives the same `max(current, previous)` the reference reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from prefixscan.sim.fast.layout import CACHEDV, INFLIGHT
from prefixscan.sim.fast.shared import (
    RING_HEADER,
    RING_NREQ,
    PolicyArrays,
    f64,
    fixed_reasons,
    i64,
    request_keys,
    ring_owner,
    ring_policy,
    ring_sync,
    ring_walk,
)
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req, Ring, request_key


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


CODE = 5


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    keys = request_keys(w, "prefix", p.prefix_blocks)
    uniq, kid = np.unique(keys, return_inverse=True)
    nk = max(len(uniq), 1)
    # si state: each request's key id, then per key its count, its window (-2: never) and the previous count
    state = np.concatenate([kid.reshape(-1), np.zeros(nk), np.full(nk, -2), np.zeros(nk)])
    return ring_policy(CODE, fixed_reasons(("prefix-home", "hot-prefix-replica")), policy, w, slots, "prefix",
                       state=state, pf=f64(p.window_s), pi=i64(p.replicas_k, p.hot_requests, nk),
                       width=max(3, min(p.replicas_k, slots)))


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    ring_sync(ci, g, si, pu)
    w = int(now // pf[0])
    replicas_k, hot_requests, nk = pi[0], pi[1], pi[2]
    k = si[RING_HEADER + i]
    cnt = RING_HEADER + si[RING_NREQ] + k
    win, prev = cnt + nk, cnt + 2 * nk
    if si[win] != w:
        si[prev] = si[cnt] if si[win] == w - 1 else 0
        si[cnt] = 0
        si[win] = w
    si[cnt] += 1
    if max(si[cnt], si[prev]) < hot_requests or replicas_k <= 1:
        r = ring_owner(ci, si, pu, pu[i])
        cand[0] = r
        return r, 0, ci[CACHEDV, r], 1
    ng = ring_walk(ci, si, pu, pu[i], replicas_k, cand)
    r = cand[0]
    for j in range(1, ng):
        if ci[INFLIGHT, cand[j]] < ci[INFLIGHT, r]:
            r = cand[j]
    return r, 1, ci[CACHEDV, r], ng
