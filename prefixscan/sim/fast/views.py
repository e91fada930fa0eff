"""The router's knowledge views (`knowledge.py`) as array kernels: delayed KV events and approximate TTL/LRU.

Same state and the same operations as `DelayedView` and `ApproxView`, in flat arrays:
- delayed: pending events are a FIFO of items (due time, replica, value, count) over one FIFO of block
  ids. Both are sized to their upper bound up front (every stored, evicted or cleared id is at most one
  event per block allocation), so nothing is reallocated during the replay;
- approximate: `last[r, b]` is the time of the latest routing record holding block b; each request is
  one record (it is routed once), kept in a per-replica FIFO linked through `rq[i, RQ_REC_NEXT]`. Counts
  are taken before assignment, like the numpy reference, so duplicate ids count the same way.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixscan.sim.fast.layout import (
    G_ID_HEAD,
    G_ID_TAIL,
    G_IT_HEAD,
    G_IT_TAIL,
    PREV_T,
    REC_HEAD,
    REC_TAIL,
    RF_REC_NOW,
    RF_REC_T,
    RQ_REC_NEXT,
    VCOUNT,
    VP_HAS_SWEEP,
    VP_MAX_BLOCKS,
    VP_NEXT_SWEEP,
    VP_SWEEP,
    VP_TTL,
)


@njit(cache=True)
def delayed_push(g, items, dids, r, value, ids, due):
    """Queue an event for replica r: set `ids` to `value` at time `due` (no-op when empty)."""
    n = len(ids)
    if n == 0:
        return
    t = g[G_IT_TAIL]
    items[t, 0] = due
    items[t, 1] = r
    items[t, 2] = value
    items[t, 3] = n
    g[G_IT_TAIL] = t + 1
    p = g[G_ID_TAIL]
    for j in range(n):
        dids[p + j] = ids[j]
    g[G_ID_TAIL] = p + n


@njit(cache=True)
def delayed_advance(g, items, dids, dres, now):
    """Deliver every event due by `now` to the view's resident set."""
    while g[G_IT_HEAD] < g[G_IT_TAIL] and items[g[G_IT_HEAD], 0] <= now:
        h = g[G_IT_HEAD]
        r, v, n = int(items[h, 1]), int(items[h, 2]), int(items[h, 3])
        p = g[G_ID_HEAD]
        for j in range(p, p + n):
            dres[r, dids[j]] = v
        g[G_ID_HEAD] = p + n
        g[G_IT_HEAD] = h + 1


@njit(cache=True)
def _expire_oldest(ci, rq, rf, last, off, wb, r):
    i = ci[REC_HEAD, r]
    ci[REC_HEAD, r] = rq[i, RQ_REC_NEXT]
    if ci[REC_HEAD, r] < 0:
        ci[REC_TAIL, r] = -1
    t = rf[i, RF_REC_T]
    c = 0
    for j in range(off[i], off[i + 1]):
        if last[r, wb[j]] == t:
            c += 1
    for j in range(off[i], off[i + 1]):
        if last[r, wb[j]] == t:
            last[r, wb[j]] = -np.inf
    ci[VCOUNT, r] -= c


@njit(cache=True)
def _prune(fp, ci, rq, rf, last, off, wb, r):
    cap = fp[VP_MAX_BLOCKS]
    if cap < 0:
        return
    while ci[VCOUNT, r] > cap and ci[REC_HEAD, r] >= 0:
        _expire_oldest(ci, rq, rf, last, off, wb, r)


@njit(cache=True)
def approx_advance(fp, ci, rq, rf, last, off, wb, now):
    """Expire records older than the TTL; at sweep times prune every replica to its size cap."""
    ttl = fp[VP_TTL]
    slots = ci.shape[1]
    if ttl != np.inf:
        limit = now - ttl
        for r in range(slots):
            while ci[REC_HEAD, r] >= 0 and rf[ci[REC_HEAD, r], RF_REC_NOW] <= limit:
                _expire_oldest(ci, rq, rf, last, off, wb, r)
    if fp[VP_HAS_SWEEP] != 0 and now >= fp[VP_NEXT_SWEEP]:
        while fp[VP_NEXT_SWEEP] <= now:
            fp[VP_NEXT_SWEEP] += fp[VP_SWEEP]
        for r in range(slots):
            _prune(fp, ci, rq, rf, last, off, wb, r)


@njit(cache=True)
def approx_route(fp, ci, cf, rq, rf, last, off, wb, r, i, now):
    """Record that request i went to replica r (record times strictly increase per replica)."""
    t = now if now > cf[PREV_T, r] else np.nextafter(cf[PREV_T, r], np.inf)
    cf[PREV_T, r] = t
    c = 0
    for j in range(off[i], off[i + 1]):
        if last[r, wb[j]] == -np.inf:
            c += 1
    ci[VCOUNT, r] += c
    for j in range(off[i], off[i + 1]):
        last[r, wb[j]] = t
    rf[i, RF_REC_NOW] = now
    rf[i, RF_REC_T] = t
    rq[i, RQ_REC_NEXT] = -1
    if ci[REC_TAIL, r] >= 0:
        rq[ci[REC_TAIL, r], RQ_REC_NEXT] = i
    else:
        ci[REC_HEAD, r] = i
    ci[REC_TAIL, r] = i
    if fp[VP_HAS_SWEEP] == 0:
        _prune(fp, ci, rq, rf, last, off, wb, r)
