"""Preble E2 scheduling (Srivatsa et al., ICLR 2025; docs/engines.md, 'Preble E2').

If the request's best cached prefix is longer than its missed part, *exploit*: among the replicas
holding that longest prefix pick the lowest load cost; otherwise *explore*: lowest load cost overall.
Load cost = prefill seconds of the requests routed there in the last `window_s` + decode seconds of its
in-flight requests + this request's uncached prefill there. Preble's post-assignment rebalancing and
prefix autoscaling are not modelled.

Compiled state: `sf` = windowed prefill seconds per slot, then the history's times and seconds; `si` = history
(head, tail), then its replicas. Each request adds one history entry, so the arrays are sized by requests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from prefixscan.sim.fast.layout import ACT, CACHEDV, FSCR0, FSCR1, G_NACT, INFL_OUT, SV_TPOT
from prefixscan.sim.fast.shared import PolicyArrays, argmin_active, f64, fixed_reasons, i64, np_max, ranked, seconds
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req


@dataclass(frozen=True)
class PrebleParams:
    window_s: float = 180.0
    knowledge: str = ""


class PrebleE2(Policy):
    name = "preble_e2"
    Params = PrebleParams

    def __init__(self, params: PrebleParams, seed: int) -> None:
        super().__init__(params, seed)
        self.hist: deque[tuple[float, int, float]] = deque()
        self.win: np.ndarray | None = None

    def choose(self, req: Req, view: ClusterView) -> Decision:
        if self.win is None:
            self.win = np.zeros(view.n)
        while self.hist and self.hist[0][0] < view.now - self.params.window_s:
            _, r0, s0 = self.hist.popleft()
            self.win[r0] -= s0
        cached = view.cached_tokens(req)
        new = req.prompt_tokens - cached
        mine = view.serving.prefill.seconds_vec(new, cached)
        decode = view.inflight_output * view.serving.tpot_s
        cost = np.maximum(self.win, 0.0) + decode + mine
        idx = view.active_idx
        best = int(cached[idx].max())
        if best > req.prompt_tokens - best:
            holders = idx[cached[idx] == best]
            r = int(holders[np.argmin(cost[holders])])
            reason = "exploit"
        else:
            r = view.argmin_active(cost)
            reason = "explore"
        self.win[r] += mine[r]
        self.hist.append((view.now, r, float(mine[r])))
        return Decision(r, view.ranked(cost), int(cached[r]), reason)


CODE = 9


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    n = max(w.n, 1)
    return PolicyArrays(CODE, fixed_reasons(("exploit", "explore")), pf=f64(policy.params.window_s), pi=i64(slots, n),
                        sf=np.zeros(slots + 2 * n), si=np.zeros(2 + n, dtype=np.int64))


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    slots, n = pi[0], pi[1]
    ht, hs = slots, slots + n  # history times and seconds in sf; replicas in si[2:]
    while si[0] < si[1] and sf[ht + si[0]] < now - pf[0]:
        sf[si[2 + si[0]]] -= sf[hs + si[0]]
        si[0] += 1
    nact = g[G_NACT]
    tpot = fp[SV_TPOT]
    best = ci[CACHEDV, ci[ACT, 0]]
    for a in range(nact):
        r = ci[ACT, a]
        c = ci[CACHEDV, r]
        cf[FSCR1, r] = seconds(fp, prompt - c, c)  # this request's own prefill there
        cf[FSCR0, r] = np_max(sf[r], 0.0) + ci[INFL_OUT, r] * tpot + cf[FSCR1, r]
        best = max(best, c)
    if best > prompt - best:
        r, reason = -1, 0
        for a in range(nact):
            x = ci[ACT, a]
            if ci[CACHEDV, x] == best and (r < 0 or cf[FSCR0, x] < cf[FSCR0, r]):
                r = x
    else:
        r, reason = argmin_active(cf, FSCR0, ci, nact), 1
    mine = cf[FSCR1, r]
    sf[r] += mine
    t = si[1]
    sf[ht + t] = now
    sf[hs + t] = mine
    si[2 + t] = r
    si[1] = t + 1
    return r, reason, ci[CACHEDV, r], ranked(cf, FSCR0, 1.0, ci, nact, 3, cand)
