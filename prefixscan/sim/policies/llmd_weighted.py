"""llm-d / Gateway API Inference Extension endpoint picker with its default weights.

The behaviour modelled: docs/engines.md, 'llm-d endpoint picker'.

score = 2 * queue + 2 * kv_utilisation + 3 * prefix, highest wins (ties at random, seeded):
- queue: (maxQ - Q) / (maxQ - minQ) over waiting requests (1 when all are equal);
- kv-utilisation: 1 - used fraction of KV blocks (pinned blocks; cached free blocks count as free);
- prefix: matched blocks / request blocks. The approximate scorer learns from its own choices with an
  LRU of 31,250 64-character blocks per server (~16 tokens each), converted to this run's block size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, FSCR0, G_CAPACITY, G_NACT, KB, KV_AVAIL, WAITING
from prefixscan.sim.fast.shared import PolicyArrays, f64, fixed_reasons, pick_best, ranked
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req


@dataclass(frozen=True)
class LlmdParams:
    queue_weight: float = 2.0
    kv_weight: float = 2.0
    prefix_weight: float = 3.0
    lru_blocks: int = 31250  # in llm-d's 16-token blocks
    knowledge: str = "approximate"


class LlmdWeighted(Policy):
    name = "llmd_weighted"
    Params = LlmdParams

    def view_options(self, block_size: int) -> dict[str, Any]:
        return {"ttl_s": float("inf"), "max_blocks": max(1, self.params.lru_blocks * 16 // block_size)}

    def choose(self, req: Req, view: ClusterView) -> Decision:
        p = self.params
        idx = view.active_idx
        q = view.waiting.astype(np.float64)
        qmax, qmin = q[idx].max(), q[idx].min()
        queue = (qmax - q) / (qmax - qmin) if qmax > qmin else np.ones(view.n)
        kv = view.kv_available / max(view.capacity, 1)
        nb = max(len(req.blocks), 1)
        prefix = view.matched_blocks(req) / nb
        score = p.queue_weight * queue + p.kv_weight * kv + p.prefix_weight * prefix
        s = score[idx]
        ties = idx[s >= s.max() - 1e-12]
        r = view.pick(ties)
        return Decision(r, view.ranked(-score), view.cached_at(req, r), "max-weighted-score")


CODE = 8


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    return PolicyArrays(CODE, fixed_reasons(("max-weighted-score",)),
                        pf=f64(p.queue_weight, p.kv_weight, p.prefix_weight))


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    nact = g[G_NACT]
    qmax = qmin = float(ci[WAITING, ci[ACT, 0]])
    for a in range(nact):
        q = float(ci[WAITING, ci[ACT, a]])
        qmax, qmin = max(qmax, q), min(qmin, q)
    nb = max(nbi, 1)
    cap = max(g[G_CAPACITY], 1)
    for a in range(nact):
        r = ci[ACT, a]
        queue = (qmax - float(ci[WAITING, r])) / (qmax - qmin) if qmax > qmin else 1.0
        kv = ci[KV_AVAIL, r] / cap
        prefix = ci[KB, r] / nb
        cf[FSCR0, r] = pf[0] * queue + pf[1] * kv + pf[2] * prefix
    r = pick_best(cf, FSCR0, -1.0, 1e-12, ci, nact, uni, g)  # the highest score, ties (within 1e-12) at random
    return r, 0, ci[CACHEDV, r], ranked(cf, FSCR0, -1.0, ci, nact, 3, cand)
