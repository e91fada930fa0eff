"""Session affinity: consistent hash of the conversation id (first K blocks when there is none)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import CACHEDV
from prefixscan.sim.fast.shared import PolicyArrays, fixed_reasons, ring_owner, ring_policy, ring_sync
from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req, Ring, request_key


@dataclass(frozen=True)
class SessionAffinityParams:
    vnodes: int = 100
    prefix_blocks: int = 4  # fallback key for requests without a conversation id


class SessionAffinity(Policy):
    name = "session_affinity"
    Params = SessionAffinityParams

    def __init__(self, params: SessionAffinityParams, seed: int) -> None:
        super().__init__(params, seed)
        self.ring = Ring(params.vnodes, seed)

    def choose(self, req: Req, view: ClusterView) -> Decision:
        self.ring.sync(view.active_idx, view.version)
        r = self.ring.owner(request_key(req, "conversation", self.params.prefix_blocks, view.workload.block_keys))
        reason = "session-hash" if req.conv_key else "prefix-hash-fallback"
        return Decision(r, (r,), view.cached_at(req, r), reason)


CODE = 3


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    reasons = fixed_reasons(("session-hash", "prefix-hash-fallback"))
    # pi: the reason per request (no conversation id: the prefix key was used)
    return ring_policy(CODE, reasons, policy, w, slots, "conversation", pi=(w.conv_key == 0).astype("int64"))


@njit(cache=True)
def kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    ring_sync(ci, g, si, pu)
    r = ring_owner(ci, si, pu, pu[i])
    cand[0] = r
    return r, pi[i], ci[CACHEDV, r], 1
