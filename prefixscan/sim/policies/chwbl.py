"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, arXiv 1608.01350).

With m requests in flight over n replicas, each replica may hold at most ceil(c * (m + 1) / n); a key
walks clockwise from its hash to the first replica under that bound (docs/engines.md, 'Routers'). `stats` records
the largest load/bound ratio ever produced so tests can check the bound is never exceeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, G_NACT, INFLIGHT, SCR0
from prefixscan.sim.fast.shared import (
    RING_HEADER,
    RING_M,
    RING_N,
    PolicyArrays,
    f64,
    i64,
    ring_next,
    ring_policy,
    ring_start,
    ring_sync,
    ring_unmark,
)
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req, Ring, request_key


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
        for r in self.ring.walk(request_key(req, self.params.key, self.params.prefix_blocks, view.workload.block_keys)):
            walked.append(r)
            if view.inflight[r] < bound:
                break
        r = walked[-1]
        ratio = (int(view.inflight[r]) + 1) / bound
        self.stats["max_load_over_bound"] = max(self.stats["max_load_over_bound"], ratio)
        if len(walked) > 1:
            self.stats["bound_spills"] += 1
        return Decision(r, tuple(walked[-3:]), view.cached_at(req, r), reason(len(walked) - 1))


CODE = 4
SPILLS = RING_HEADER  # si: bound spills; sf[0]: the largest load/bound ratio produced


def reason(skipped: int) -> str:
    """The decision's reason (both forms): the home replica, or how many replicas over the bound it skipped."""
    return "home" if skipped == 0 else f"bounded-load-skip-{skipped}"


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    return ring_policy(CODE, reason, policy, w, slots, p.key, state=i64(0), pf=f64(p.c),
                       stats=lambda sf, si: {"max_load_over_bound": float(sf[0]), "bound_spills": int(si[SPILLS])})


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    ring_sync(ci, g, si, pu)
    nact = g[G_NACT]
    m = 0
    for a in range(nact):
        m += ci[INFLIGHT, ci[ACT, a]]
    bound = math.ceil(pf[0] * (m + 1) / nact)
    pos = ring_start(ci, si, pu, pu[i])
    walked = ci[SCR0]
    nw = 0
    for j in range(si[RING_M]):
        r = ring_next(ci, si, pos, j)
        if r < 0:
            continue
        walked[nw] = r
        nw += 1
        if ci[INFLIGHT, r] < bound or nw == si[RING_N]:
            break
    ring_unmark(ci, walked, nw)
    r = walked[nw - 1]
    ratio = (ci[INFLIGHT, r] + 1) / bound
    if ratio > sf[0]:
        sf[0] = ratio
    if nw > 1:
        si[SPILLS] += 1
    nc = 0
    for j in range(max(nw - 3, 0), nw):
        cand[nc] = walked[j]
        nc += 1
    return r, nw - 1, ci[CACHEDV, r], nc
