"""Compiled `session_affinity` (policies/session_affinity.py): the ring owner of the conversation key."""

from __future__ import annotations

from typing import Any

from numba import njit

from prefixscan.sim.fast.layout import CACHEDV
from prefixscan.sim.fast.policies.base import PolicyArrays, fixed_reasons, ring_policy
from prefixscan.sim.fast.policies.common import ring_owner, ring_sync

CODE = 3


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    pa = ring_policy(
        CODE, fixed_reasons(("session-hash", "prefix-hash-fallback")), policy, w, slots, "conversation"
    )
    pa.pi = (w.conv_key == 0).astype("int64")  # reason: no conversation id, the prefix key was used
    return pa


@njit(cache=True)
def choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    ring_sync(ci, g, si, pu)
    r = ring_owner(ci, si, pu, pu[i])
    cand[0] = r
    return r, pi[i], ci[CACHEDV, r], 1
