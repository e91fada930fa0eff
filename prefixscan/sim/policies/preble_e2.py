"""Preble E2 scheduling (Srivatsa et al., ICLR 2025; docs/engines.md, 'Preble E2').

If the request's best cached prefix is longer than its missed part, *exploit*: among the replicas
holding that longest prefix pick the lowest load cost; otherwise *explore*: lowest load cost overall.
Load cost = prefill seconds of the requests routed there in the last `window_s` + decode seconds of its
in-flight requests + this request's uncached prefill there. Preble's post-assignment rebalancing and
prefix autoscaling are not modelled.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

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
