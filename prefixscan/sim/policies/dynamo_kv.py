"""NVIDIA Dynamo KV router (docs/engines.md, 'Dynamo KV router').

cost(worker) = overlap_score_weight * prefill_blocks + decode_blocks, lowest wins; prefill_blocks are the
request's blocks not cached on the worker, decode_blocks the blocks of requests active on it. Weight 0
is pure load balancing. Temperature 0 is deterministic (ties to the lowest id); > 0 samples a softmax
over normalised costs. Exact mode uses KV events; `knowledge=approximate` is `--no-kv-events` with the
120 s TTL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req


@dataclass(frozen=True)
class DynamoParams:
    overlap_score_weight: float = 1.0
    router_temperature: float = 0.0
    knowledge: str = ""  # "" = the run's --knowledge


def softmax_sample(costs: list[float], ids: list[int], temperature: float, u: float) -> int:
    """Sample a replica with weight exp(-(cost - min) / span / T) using the uniform u.

    Scalar math.exp and a running sum, in this order, so the compiled policy draws the same replica.
    """
    lo, hi = min(costs), max(costs)
    scale = hi - lo if hi - lo > 0 else 1.0
    weights = [math.exp(-(c - lo) / scale / temperature) for c in costs]
    total = 0.0
    for wgt in weights:  # a plain running sum (builtin sum compensates rounding on Python >= 3.12)
        total += wgt
    target = u * total
    cum = 0.0
    for r, wgt in zip(ids, weights, strict=True):
        cum += wgt
        if cum > target:
            return r
    return ids[-1]


class DynamoKv(Policy):
    name = "dynamo_kv"
    Params = DynamoParams

    def choose(self, req: Req, view: ClusterView) -> Decision:
        p = self.params
        k = view.matched_blocks(req)
        cost = p.overlap_score_weight * (len(req.blocks) - k) + view.load_blocks
        cost = cost.astype(np.float64)
        idx = view.active_idx
        if p.router_temperature > 0:
            r = softmax_sample(cost[idx].tolist(), idx.tolist(), p.router_temperature, view.uniform())
            reason = "softmax-sample"
        else:
            r = view.argmin_active(cost)
            reason = "min-cost" if k[r] == k[idx].max() else "min-cost-load"
        return Decision(r, view.ranked(cost), view.cached_at(req, r), reason)
