"""Compiled `cost_based` (policies/cost_based.py): the warmest replica within the TTFT margin, else best TTFT."""

from __future__ import annotations

from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, DECODING, FSCR0, FSCR1, G_NACT, KB, KV_AVAIL, QUEUED_BLOCKS, SCR0
from prefixscan.sim.fast.policies.base import PolicyArrays, f64, fixed_reasons, i64
from prefixscan.sim.fast.policies.common import backlog, ranked, seconds, share

CODE = 10
REASONS = (
    "prefer-warm-worker",
    "partial-warm-worker",
    "cold-pool",
    "best-ttft",
    "warm-wait-exceeded",
    "warm-too-slow",
)


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    pa = PolicyArrays(CODE, fixed_reasons(REASONS))
    pa.pf = f64(p.margin_rel, p.margin_abs_s, p.max_warm_wait_s, p.interference_weight, p.kv_risk_s)
    pa.pi = i64(p.min_warm_tokens, p.cold_pool)
    return pa


@njit(cache=True)
def predicted_cost(now, nbi, prompt, ci, cf, g, fp, weight, risk):
    """cost_based.predicted_cost per active replica: queue wait in cf[FSCR1], score in cf[FSCR0]."""
    for a in range(g[G_NACT]):
        r = ci[ACT, a]
        wt = backlog(cf, r, now)
        c = ci[CACHEDV, r]
        ttft = wt + seconds(fp, prompt - c, c) / share(fp, ci[DECODING, r])
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
def choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    nact = g[G_NACT]
    predicted_cost(now, nbi, prompt, ci, cf, g, fp, pf[3], pf[4])
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
