"""Compiled `prefix_hash` (policies/prefix_hash.py): ring home of the first K blocks, hot prefixes spread.

The reference keeps per-window dicts of prefix counts; here each prefix key has a dense id and three
counters (count, the window it counts, count in the window before), rolled over lazily on first touch
in a new window, which gives the same `max(current, previous)` the reference reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from prefixscan.sim.fast.layout import CACHEDV, INFLIGHT
from prefixscan.sim.fast.policies.base import PolicyArrays, f64, fixed_reasons, i64, request_keys, ring_policy
from prefixscan.sim.fast.policies.common import RING_HEADER, RING_NREQ, ring_owner, ring_sync, ring_walk

CODE = 5


def setup(policy: Any, w: Any, slots: int) -> PolicyArrays:
    p = policy.params
    keys = request_keys(w, "prefix", p.prefix_blocks)
    uniq, kid = np.unique(keys, return_inverse=True)
    nk = max(len(uniq), 1)
    # si state: each request's key id, then per key its count, its window (-2: never) and the previous count
    state = np.concatenate([kid.reshape(-1), np.zeros(nk), np.full(nk, -2), np.zeros(nk)])
    pa = ring_policy(
        CODE, fixed_reasons(("prefix-home", "hot-prefix-replica")), policy, w, slots, "prefix", state=state
    )
    pa.pf = f64(p.window_s)
    pa.pi = i64(p.replicas_k, p.hot_requests, nk)
    pa.width = max(3, min(p.replicas_k, slots))
    return pa


@njit(cache=True)
def choose(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    ring_sync(ci, g, si, pu)
    w = int(now // pf[0])
    replicas_k, hot_requests, nk = pi[0], pi[1], pi[2]
    k = si[RING_HEADER + i]
    cnt = RING_HEADER + si[RING_NREQ] + k
    win, prev = cnt + nk, cnt + 2 * nk
    if si[win] != w:
        si[prev] = si[cnt] if si[win] == w - 1 else 0
        si[cnt] = 0
        si[win] = w
    si[cnt] += 1
    if max(si[cnt], si[prev]) < hot_requests or replicas_k <= 1:
        r = ring_owner(ci, si, pu, pu[i])
        cand[0] = r
        return r, 0, ci[CACHEDV, r], 1
    ng = ring_walk(ci, si, pu, pu[i], replicas_k, cand)
    r = cand[0]
    for j in range(1, ng):
        if ci[INFLIGHT, cand[j]] < ci[INFLIGHT, r]:
            r = cand[j]
    return r, 1, ci[CACHEDV, r], ng
