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

from prefixscan.sim.fast import layout as L


@njit(cache=True)
def delayed_push(g, items, dids, r, value, ids, due):
    """Queue an event for replica r: set `ids` to `value` at time `due` (no-op when empty)."""
    n = len(ids)
    if n == 0:
        return
    t = g[L.G_IT_TAIL]
    items[t, 0] = due
    items[t, 1] = r
    items[t, 2] = value
    items[t, 3] = n
    g[L.G_IT_TAIL] = t + 1
    p = g[L.G_ID_TAIL]
    for j in range(n):
        dids[p + j] = ids[j]
    g[L.G_ID_TAIL] = p + n


@njit(cache=True)
def delayed_advance(g, items, dids, dres, now):
    """Deliver every event due by `now` to the view's resident set."""
    while g[L.G_IT_HEAD] < g[L.G_IT_TAIL] and items[g[L.G_IT_HEAD], 0] <= now:
        h = g[L.G_IT_HEAD]
        r, v, n = int(items[h, 1]), int(items[h, 2]), int(items[h, 3])
        p = g[L.G_ID_HEAD]
        for j in range(p, p + n):
            dres[r, dids[j]] = v
        g[L.G_ID_HEAD] = p + n
        g[L.G_IT_HEAD] = h + 1


@njit(cache=True)
def _expire_oldest(ci, rq, rf, last, off, wb, r):
    i = ci[L.REC_HEAD, r]
    ci[L.REC_HEAD, r] = rq[i, L.RQ_REC_NEXT]
    if ci[L.REC_HEAD, r] < 0:
        ci[L.REC_TAIL, r] = -1
    t = rf[i, L.RF_REC_T]
    c = 0
    for j in range(off[i], off[i + 1]):
        if last[r, wb[j]] == t:
            c += 1
    for j in range(off[i], off[i + 1]):
        if last[r, wb[j]] == t:
            last[r, wb[j]] = -np.inf
    ci[L.VCOUNT, r] -= c


@njit(cache=True)
def _prune(fp, ci, rq, rf, last, off, wb, r):
    cap = fp[L.VP_MAX_BLOCKS]
    if cap < 0:
        return
    while ci[L.VCOUNT, r] > cap and ci[L.REC_HEAD, r] >= 0:
        _expire_oldest(ci, rq, rf, last, off, wb, r)


@njit(cache=True)
def approx_advance(fp, ci, rq, rf, last, off, wb, now):
    """Expire records older than the TTL; at sweep times prune every replica to its size cap."""
    ttl = fp[L.VP_TTL]
    slots = ci.shape[1]
    if ttl != np.inf:
        limit = now - ttl
        for r in range(slots):
            while ci[L.REC_HEAD, r] >= 0 and rf[ci[L.REC_HEAD, r], L.RF_REC_NOW] <= limit:
                _expire_oldest(ci, rq, rf, last, off, wb, r)
    if fp[L.VP_HAS_SWEEP] != 0 and now >= fp[L.VP_NEXT_SWEEP]:
        while fp[L.VP_NEXT_SWEEP] <= now:
            fp[L.VP_NEXT_SWEEP] += fp[L.VP_SWEEP]
        for r in range(slots):
            _prune(fp, ci, rq, rf, last, off, wb, r)


@njit(cache=True)
def approx_route(fp, ci, cf, rq, rf, last, off, wb, r, i, now):
    """Record that request i went to replica r (record times strictly increase per replica)."""
    t = now if now > cf[L.PREV_T, r] else np.nextafter(cf[L.PREV_T, r], np.inf)
    cf[L.PREV_T, r] = t
    c = 0
    for j in range(off[i], off[i + 1]):
        if last[r, wb[j]] == -np.inf:
            c += 1
    ci[L.VCOUNT, r] += c
    for j in range(off[i], off[i + 1]):
        last[r, wb[j]] = t
    rf[i, L.RF_REC_NOW] = now
    rf[i, L.RF_REC_T] = t
    rq[i, L.RQ_REC_NEXT] = -1
    if ci[L.REC_TAIL, r] >= 0:
        rq[ci[L.REC_TAIL, r], L.RQ_REC_NEXT] = i
    else:
        ci[L.REC_HEAD, r] = i
    ci[L.REC_TAIL, r] = i
    if fp[L.VP_HAS_SWEEP] == 0:
        _prune(fp, ci, rq, rf, last, off, wb, r)
