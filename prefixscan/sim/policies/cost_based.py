"""Cost-based routing, the rule of the team's seed document ("Prefix-aware routing in an LLM cluster").

Predicted TTFT per replica = queue wait + uncached prefill (at its decode load) + interference with the
running decodes (decode-seconds this prefill stalls, weighted) + KV memory risk (a penalty when the
blocks it needs exceed what is free after the queue). Ranked choice:
1-2. the warm replica with the most cached tokens (exact, then partial hits) whose queue wait is under
     `max_warm_wait_s` and whose TTFT is within the margin of the best replica overall;
3.   otherwise the best predicted TTFT (the warm candidates would delay the request too long);
4.   with `cold_pool` > 0 the last `cold_pool` active replicas only take requests with no warm candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req


@dataclass(frozen=True)
class CostBasedParams:
    margin_rel: float = 0.2
    margin_abs_s: float = 0.05
    max_warm_wait_s: float = 2.0
    min_warm_tokens: int = 1
    interference_weight: float = 0.01
    kv_risk_s: float = 1.0
    cold_pool: int = 0
    knowledge: str = ""


def predicted_cost(
    req: Req, view: ClusterView, cached: np.ndarray, interference_weight: float, kv_risk_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """(queue wait, predicted TTFT + penalties) per replica; shared with the oracle."""
    wait, ttft = view.predicted_ttft(req, cached)
    prefill = ttft - wait
    interference = interference_weight * prefill * view.decoding
    need = len(req.blocks) - view.matched_blocks(req)
    short = need > (view.kv_available - view.queued_blocks)
    return wait, ttft + interference + np.where(short, kv_risk_s, 0.0)


class CostBased(Policy):
    name = "cost_based"
    Params = CostBasedParams

    def choose(self, req: Req, view: ClusterView) -> Decision:
        p = self.params
        cached = view.cached_tokens(req)
        wait, score = predicted_cost(req, view, cached, p.interference_weight, p.kv_risk_s)
        idx = view.active_idx
        warm_any = bool((cached[idx] >= p.min_warm_tokens).any())
        if 0 < p.cold_pool < len(idx):
            main, cold = idx[: len(idx) - p.cold_pool], idx[len(idx) - p.cold_pool :]
            pool = main if warm_any else cold
        else:
            pool = idx
        best = int(pool[np.argmin(score[pool])])
        limit = score[best] * (1.0 + p.margin_rel) + p.margin_abs_s
        warm = pool[cached[pool] >= p.min_warm_tokens]
        top = int(cached[pool].max())
        reason = "cold-pool" if pool is not idx and not warm_any else "best-ttft"
        if len(warm):
            order = warm[np.lexsort((score[warm], -cached[warm]))]
            rejected_wait = False
            for r in order:
                r = int(r)
                if wait[r] > p.max_warm_wait_s:
                    rejected_wait = True
                    continue
                if score[r] <= limit:
                    kind = "prefer-warm-worker" if cached[r] == top else "partial-warm-worker"
                    return Decision(r, tuple(int(x) for x in order[:3]), int(cached[r]), kind)
            reason = "warm-wait-exceeded" if rejected_wait else "warm-too-slow"
        return Decision(best, view.ranked(score), int(cached[best]), reason)
