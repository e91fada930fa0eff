"""Session affinity: consistent hash of the conversation id (first K blocks when there is none)."""

from __future__ import annotations

from dataclasses import dataclass

from prefixscan.sim.policies.base import ClusterView, Decision, Policy, Req
from prefixscan.sim.policies.ring import Ring, request_key


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
        r = self.ring.owner(
            request_key(req, "conversation", self.params.prefix_blocks, view.workload.block_keys)
        )
        reason = "session-hash" if req.conv_key else "prefix-hash-fallback"
        return Decision(r, (r,), view.cached_at(req, r), reason)
