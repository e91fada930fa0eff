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

    def __init__(self, params: LlmdParams, seed: int) -> None:
        super().__init__(params, seed)
        self.block_size = 16

    def view_options(self) -> dict[str, Any]:
        return {"ttl_s": float("inf"), "max_blocks": max(1, self.params.lru_blocks * 16 // self.block_size)}

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
