"""What every compiled policy shares: the cluster-view helpers of `policies/base.py` over arrays.

Each helper reproduces its reference counterpart's tie rules exactly: `argmin_active` takes the lowest
replica id among equal values (np.argmin), `ranked` is a stable ascending order over the active
replicas (np.argsort kind="stable"), `pick` draws the next uniform of the policy's seeded stream, the
ring walks distinct replicas clockwise like `ring.Ring.walk`. Values live in rows of `ci` / `cf`
(`layout.py`) so helpers take the matrix and a row, not a fresh view.

Ring state: `si` starts with (version, points, replicas, vnodes, offset of the owners in si, requests);
`pu` holds the per-request keys, then every slot's virtual-node points, then the sorted active points.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixscan.sim.fast.layout import (
    ACT,
    G_NACT,
    G_UPTR,
    G_VERSION,
    LANE_UNTIL,
    QUEUED_PREFILL,
    SCR1,
    SV_A,
    SV_B,
    SV_BUDGET,
    SV_C,
    SV_D,
    SV_E,
)

RING_VER, RING_M, RING_N, RING_VN, RING_OWN, RING_NREQ = 0, 1, 2, 3, 4, 5
RING_HEADER = 6


@njit(cache=True)
def py_max(a, b):
    """Python's max(a, b): a unless b is strictly larger."""
    return b if b > a else a


@njit(cache=True)
def np_max(a, b):
    """np.maximum for two floats: a unless b is larger (NaN in a wins)."""
    return a if a >= b or a != a else b


@njit(cache=True)
def seconds(fp, new, cached):
    """PrefillModel.seconds: solo prefill seconds for `new` uncached and `cached` tokens."""
    if new <= 0:
        return 0.0
    x, c = float(new), float(cached)
    ms = fp[SV_A] + fp[SV_B] * x + fp[SV_C] * c + fp[SV_D] * x * c + fp[SV_E] * x * x
    return py_max(ms, 0.0) / 1000.0


@njit(cache=True)
def share(fp, decoding):
    """Fraction of the step token budget a prefill gets beside `decoding` running decodes."""
    budget = int(fp[SV_BUDGET])
    return max(budget - decoding, 1) / budget


@njit(cache=True)
def backlog(cf, r, now):
    """ClusterView.backlog_s for one replica."""
    return np_max(cf[LANE_UNTIL, r] - now, 0.0) + cf[QUEUED_PREFILL, r]


@njit(cache=True)
def pick(ci, row, n, uni, g):
    """ClusterView.pick: a seeded uniform choice among the first n replicas of row `row` of ci."""
    if n == 1:
        return ci[row, 0]
    u = uni[g[G_UPTR]]
    g[G_UPTR] += 1
    return ci[row, int(u * n)]


@njit(cache=True)
def argmin_active(cf, row, ci, nact):
    """Lowest value of cf[row] among active replicas; ties go to the lowest id."""
    best = ci[ACT, 0]
    for a in range(1, nact):
        r = ci[ACT, a]
        if cf[row, r] < cf[row, best]:
            best = r
    return best


@njit(cache=True)
def ranked(cf, row, sign, ci, nact, k, out):
    """First k active replicas by ascending sign * cf[row], stable; returns how many were written."""
    m = min(k, nact)
    pv, pp = 0.0, -1
    for j in range(m):
        bi, bv = -1, 0.0
        for p in range(nact):
            v = sign * cf[row, ci[ACT, p]]
            if j > 0 and (v < pv or (v == pv and p <= pp)):
                continue  # already ranked
            if bi < 0 or v < bv:
                bi, bv = p, v
        out[j] = ci[ACT, bi]
        pv, pp = bv, bi
    return m


@njit(cache=True)
def ring_sync(ci, g, si, pu):
    """Ring.sync: rebuild the sorted virtual-node points when the active set changed."""
    if si[RING_VER] == g[G_VERSION]:
        return
    vn, n, own = si[RING_VN], si[RING_NREQ], si[RING_OWN]
    nact = g[G_NACT]
    sp, rp = n, n + ci.shape[1] * vn
    m = nact * vn
    pts = np.empty(m, dtype=np.uint64)
    for a in range(nact):
        for v in range(vn):
            pts[a * vn + v] = pu[sp + ci[ACT, a] * vn + v]
    order = np.argsort(pts, kind="mergesort")
    for j in range(m):
        pu[rp + j] = pts[order[j]]
        si[own + j] = ci[ACT, order[j] // vn]
    si[RING_M] = m
    si[RING_N] = nact
    si[RING_VER] = g[G_VERSION]


@njit(cache=True)
def ring_start(ci, si, pu, key):
    """Position of a key on the ring (np.searchsorted side="left")."""
    rp = si[RING_NREQ] + ci.shape[1] * si[RING_VN]
    lo, hi = 0, si[RING_M]
    while lo < hi:
        mid = (lo + hi) // 2
        if pu[rp + mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def ring_owner(ci, si, pu, key):
    """Ring.owner: the first replica clockwise from the key."""
    return si[si[RING_OWN] + ring_start(ci, si, pu, key) % si[RING_M]]


@njit(cache=True)
def ring_next(ci, si, pos, j):
    """Ring.walk step: the j-th point clockwise from pos; -1 if its replica was already yielded.

    Yielded replicas are marked in ci[SCR1]; `ring_unmark` clears them after the walk.
    """
    r = si[si[RING_OWN] + (pos + j) % si[RING_M]]
    if ci[SCR1, r]:
        return -1
    ci[SCR1, r] = 1
    return r


@njit(cache=True)
def ring_unmark(ci, out, n):
    for j in range(n):
        ci[SCR1, out[j]] = 0


@njit(cache=True)
def ring_walk(ci, si, pu, key, limit, out):
    """The first `limit` distinct replicas clockwise from the key; returns how many."""
    pos = ring_start(ci, si, pu, key)
    n = 0
    for j in range(si[RING_M]):
        r = ring_next(ci, si, pos, j)
        if r >= 0:
            out[n] = r
            n += 1
            if n == si[RING_N] or n == limit:
                break
    ring_unmark(ci, out, n)
    return n
