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
from typing import Any

import numpy as np
from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, DECODING, FSCR0, FSCR1, G_NACT, KB, KV_AVAIL, QUEUED_BLOCKS, SCR0
from prefixscan.sim.fast.shared import PolicyArrays, backlog, f64, fixed_reasons, i64, prefill_s, ranked
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


CODE = 10
REASONS = ("prefer-warm-worker", "partial-warm-worker", "cold-pool", "best-ttft", "warm-wait-exceeded", "warm-too-slow")


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    pf = f64(p.margin_rel, p.margin_abs_s, p.max_warm_wait_s, p.interference_weight, p.kv_risk_s)
    return PolicyArrays(CODE, fixed_reasons(REASONS), pf=pf, pi=i64(p.min_warm_tokens, p.cold_pool))


@njit(cache=True)
def predicted_cost_kernel(now, nbi, prompt, ci, cf, g, fp, weight, risk):
    """cost_based.predicted_cost per active replica: queue wait in cf[FSCR1], score in cf[FSCR0]."""
    for a in range(g[G_NACT]):
        r = ci[ACT, a]
        wt = backlog(cf, r, now)
        c = ci[CACHEDV, r]
        ttft = wt + prefill_s(fp, prompt - c, c, ci[DECODING, r])
        interference = weight * (ttft - wt) * ci[DECODING, r]
        short = nbi - ci[KB, r] > ci[KV_AVAIL, r] - ci[QUEUED_BLOCKS, r]
        cf[FSCR0, r] = ttft + interference + (risk if short else 0.0)
        cf[FSCR1, r] = wt


@njit(cache=True)
def _before(ci, cf, a, b):
    """np.lexsort((score, -cached)) order: more cached first, then lower score."""
    ca, cb = ci[CACHEDV, a], ci[CACHEDV, b]
    return ca > cb or (ca == cb and cf[FSCR0, a] < cf[FSCR0, b])


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    nact = g[G_NACT]
    predicted_cost_kernel(now, nbi, prompt, ci, cf, g, fp, pf[3], pf[4])
    min_warm, cold_pool = pi[0], pi[1]
    warm_any = False
    for a in range(nact):
        warm_any = warm_any or ci[CACHEDV, ci[ACT, a]] >= min_warm
    lo, hi, pooled = 0, nact, 0 < cold_pool < nact
    if pooled:
        lo, hi = (0, nact - cold_pool) if warm_any else (nact - cold_pool, nact)
    best = ci[ACT, lo]
    top = ci[CACHEDV, best]
    nw = 0
    for a in range(lo, hi):
        r = ci[ACT, a]
        if cf[FSCR0, r] < cf[FSCR0, best]:
            best = r
        top = max(top, ci[CACHEDV, r])
        if ci[CACHEDV, r] >= min_warm:  # stable insertion into the lexsort order
            j = nw
            while j > 0 and _before(ci, cf, r, ci[SCR0, j - 1]):
                ci[SCR0, j] = ci[SCR0, j - 1]
                j -= 1
            ci[SCR0, j] = r
            nw += 1
    limit = cf[FSCR0, best] * (1.0 + pf[0]) + pf[1]
    reason = 2 if pooled and not warm_any else 3
    if nw:
        rejected = False
        for j in range(nw):
            r = ci[SCR0, j]
            if cf[FSCR1, r] > pf[2]:
                rejected = True
                continue
            if cf[FSCR0, r] <= limit:
                for k in range(min(nw, 3)):
                    cand[k] = ci[SCR0, k]
                return r, 0 if ci[CACHEDV, r] == top else 1, ci[CACHEDV, r], min(nw, 3)
        reason = 4 if rejected else 5
    return best, reason, ci[CACHEDV, best], ranked(cf, FSCR0, 1.0, ci, nact, 3, cand)
