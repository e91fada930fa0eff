"""SGLang router `cache_aware` policy (sgl-router / model gateway), its defaults.

The behaviour modelled: docs/engines.md, 'SGLang `cache_aware`'.

Per worker the router keeps an approximate tree of what it routed there (here: the blocks of those
requests, the router's own knowledge, pruned LRU to `max_tree_size` every `eviction_interval_s`).
Per request:
1. imbalanced if max_load - min_load > balance_abs_threshold and max_load > min_load * balance_rel_threshold:
   least-loaded worker (load = requests in flight);
2. else if the best match covers more than `cache_threshold` of the prompt: that worker;
3. else the worker with the smallest tree. Rule 3 ignores load, the known "death spiral" (sglang
   PRs #14305, #14532), which this replay reproduces.
The real tree matches characters; block granularity here undercounts partial-block matches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, FSCR0, G_NACT, INFLIGHT, KB, VCOUNT
from prefixscan.sim.fast.shared import PolicyArrays, argmin_active, f64, fixed_reasons, i64, ranked
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req


@dataclass(frozen=True)
class SglangParams:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_size: int = 2**26  # characters (sgl-router default), converted at chars_per_token
    chars_per_token: float = 4.0
    knowledge: str = "approximate"


class SglangCacheAware(Policy):
    name = "sglang_cache_aware"
    Params = SglangParams

    def view_options(self, block_size: int) -> dict[str, Any]:
        p = self.params
        return {
            "ttl_s": float("inf"),
            "sweep_s": p.eviction_interval_s,
            "max_blocks": max(1, int(p.max_tree_size / p.chars_per_token / block_size)),
        }

    def choose(self, req: Req, view: ClusterView) -> Decision:
        p = self.params
        idx = view.active_idx
        load = view.inflight[idx]
        lo, hi = int(load.min()), int(load.max())
        cached = view.cached_tokens(req)
        if hi - lo > p.balance_abs_threshold and hi > lo * p.balance_rel_threshold:
            r = int(idx[np.argmin(load)])
            return Decision(r, view.ranked(view.inflight.astype(np.float64)), int(cached[r]), "imbalanced-least-load")
        k = view.matched_blocks(req)
        best = int(idx[np.argmax(k[idx])])
        rate = float(cached[best]) / max(req.prompt_tokens, 1)
        if rate > p.cache_threshold:
            return Decision(best, view.ranked(-cached.astype(np.float64)), int(cached[best]), "cache-match")
        know = view.knowledge
        sizes = np.array([know.size(int(r)) if hasattr(know, "size") else 0 for r in range(view.n)], dtype=np.float64)
        r = view.argmin_active(sizes)
        return Decision(r, view.ranked(sizes), int(cached[r]), "smallest-tree")


CODE = 6


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    return PolicyArrays(CODE, fixed_reasons(("imbalanced-least-load", "cache-match", "smallest-tree")),
                        pf=f64(p.cache_threshold, p.balance_rel_threshold), pi=i64(p.balance_abs_threshold))


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    nact = g[G_NACT]
    lo = hi = ci[INFLIGHT, ci[ACT, 0]]
    for a in range(nact):
        r = ci[ACT, a]
        lo, hi = min(lo, ci[INFLIGHT, r]), max(hi, ci[INFLIGHT, r])
        cf[FSCR0, r] = float(ci[INFLIGHT, r])
    if hi - lo > pi[0] and hi > lo * pf[1]:
        r = argmin_active(cf, FSCR0, ci, nact)
        return r, 0, ci[CACHEDV, r], ranked(cf, FSCR0, 1.0, ci, nact, 3, cand)
    best = ci[ACT, 0]
    for a in range(1, nact):
        if ci[KB, ci[ACT, a]] > ci[KB, best]:
            best = ci[ACT, a]
    if float(ci[CACHEDV, best]) / max(prompt, 1) > pf[0]:
        for a in range(nact):
            cf[FSCR0, ci[ACT, a]] = float(ci[CACHEDV, ci[ACT, a]])
        return best, 1, ci[CACHEDV, best], ranked(cf, FSCR0, -1.0, ci, nact, 3, cand)
    for a in range(nact):
        cf[FSCR0, ci[ACT, a]] = float(ci[VCOUNT, ci[ACT, a]])  # tree sizes; zero unless the view is approximate
    r = argmin_active(cf, FSCR0, ci, nact)
    return r, 2, ci[CACHEDV, r], ranked(cf, FSCR0, 1.0, ci, nact, 3, cand)
