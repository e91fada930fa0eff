"""The compiled event loop: `engine.replay` step for step, over arrays, for any policy code.

Arrays (see `layout.py` for rows and columns): `off`/`wb` the requests' dense block ids, `rq`/`rf` one
row of inputs and results per request, `cand` candidate replicas, `ci`/`cf`/`g`/`fp` the cluster's
counters, globals and model parameters; `res`..`scratch` are `KVState`'s arrays and `tbl` the
requests' block tables (from `RQ_TOFF`), driven by the same `kvcache` kernels the reference calls;
`items`/`dids`/`dres` the delayed view, `last` the approximate view; `ht`/`hm` the event heap (below);
`pf`..`uni` the policy's arrays (`shared.PolicyArrays`); `ev_*` the scenario events sorted by time.
Helpers take the arrays they use one by one: numba updates a reference count per array argument, so
passing tuples of every array would cost more than the work itself.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prefixscan.reuse.hitrule import block_tokens
from prefixscan.sim.fast import layout as L
from prefixscan.sim.fast.shared import prefill_ms, prefill_s, py_max, share
from prefixscan.sim.fast.views import approx_advance, approx_route, delayed_advance, delayed_push
from prefixscan.sim.kvcache import (
    admit,
    available,
    clear_free,
    decode_steps,
    generated_blocks,
    match_all,
    release,
    release_gen,
)
from prefixscan.sim.policies import (
    chwbl,
    cost_based,
    dynamo_kv,
    least_loaded,
    llmd_weighted,
    oracle,
    preble_e2,
    prefix_hash,
    random_policy,
    round_robin,
    session_affinity,
    sglang_cache_aware,
)

# The event heap: a binary min-heap in arrays, ordered like the reference's (time, kind, counter) tuples.
# `hm[j]` = (kind * 2^42 + counter, replica, request): (time, packed key) compares exactly as heapq compares
# the tuples, and counters are unique, so events pop in the reference's order whatever the heap layout.
KIND_SHIFT = 1 << 42


@njit(cache=True)
def _heap_less(ht, hm, a, b):
    return ht[a] < ht[b] or (ht[a] == ht[b] and hm[a, 0] < hm[b, 0])


@njit(cache=True)
def _heap_swap(ht, hm, a, b):
    ht[a], ht[b] = ht[b], ht[a]
    for c in range(3):
        hm[a, c], hm[b, c] = hm[b, c], hm[a, c]


@njit(cache=True)
def heap_push(ht, hm, size, t, kind, counter, r, i):
    """Insert an event; returns the new size."""
    j = size
    ht[j] = t
    hm[j, 0] = kind * KIND_SHIFT + counter
    hm[j, 1] = r
    hm[j, 2] = i
    while j > 0:
        parent = (j - 1) // 2
        if not _heap_less(ht, hm, j, parent):
            break
        _heap_swap(ht, hm, j, parent)
        j = parent
    return size + 1


@njit(cache=True)
def heap_pop(ht, hm, size):
    """Remove the earliest event; returns (time, kind, replica, request, new size)."""
    t, kind, r, i = ht[0], hm[0, 0] // KIND_SHIFT, hm[0, 1], hm[0, 2]
    size -= 1
    if size > 0:
        ht[0] = ht[size]
        for c in range(3):
            hm[0, c] = hm[size, c]
        j = 0
        while True:
            a, b, m = 2 * j + 1, 2 * j + 2, j
            if a < size and _heap_less(ht, hm, a, m):
                m = a
            if b < size and _heap_less(ht, hm, b, m):
                m = b
            if m == j:
                break
            _heap_swap(ht, hm, j, m)
            j = m
    return t, kind, r, i, size


# One entry point for every policy: branch on the policy's integer code (each policy module's CODE, its place
# in `sim.policies.POLICIES`) and call the module's `kernel`.
@njit(cache=True)
def choose(code, i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand):
    """Route request i: (replica, reason code, predicted cached tokens, candidates written to `cand`)."""
    if code == round_robin.CODE:
        return round_robin.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == random_policy.CODE:
        return random_policy.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == least_loaded.CODE:
        return least_loaded.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == session_affinity.CODE:
        return session_affinity.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == chwbl.CODE:
        return chwbl.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == prefix_hash.CODE:
        return prefix_hash.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == sglang_cache_aware.CODE:
        return sglang_cache_aware.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == dynamo_kv.CODE:
        return dynamo_kv.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == llmd_weighted.CODE:
        return llmd_weighted.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == preble_e2.CODE:
        return preble_e2.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    if code == cost_based.CODE:
        return cost_based.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)
    return oracle.kernel(i, now, nbi, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand)


@njit(cache=True)
def _account(ci, cf, r, now):
    dt = now - cf[L.LAST_T, r]
    if dt > 0:
        cf[L.AREA_OUT, r] += dt * ci[L.INFLIGHT, r]
        cf[L.AREA_WAIT, r] += dt * ci[L.WAITING, r]
        cf[L.LAST_T, r] = now


@njit(cache=True)
def _decode_s(fp, output_tokens, decoding):
    tpot = fp[L.SV_TPOT] * (1.0 + fp[L.SV_SLOW] * max(decoding - 1, 0))
    return decode_steps(output_tokens) * tpot


@njit(cache=True)
def _set_active(ci, g):
    n = 0
    for r in range(ci.shape[1]):
        if ci[L.ACTIVE, r]:
            ci[L.ACT, n] = r
            n += 1
    g[L.G_NACT] = n
    g[L.G_VERSION] += 1


@njit(cache=True)
def _admit_head(r, now, off, wb, rq, rf, ci, cf, g, fp, res, kf, sl, slf, meta, evictions, age_sum, hist,
                scratch, tbl, items, dids):
    """Admit replica r's queue head if its blocks fit (engine.py admit_head): its id, or -1."""
    i = ci[L.WQ_HEAD, r]
    s = off[i]
    blocks = wb[s : s + rq[i, L.RQ_PIN]]
    extra = rq[i, L.RQ_EXTRA]
    t0 = rq[i, L.RQ_TOFF]
    total = rq[i, L.RQ_PIN] + extra
    k, ne = admit(res, kf, sl, slf, meta, evictions, age_sum, hist, scratch, r, blocks, rq[i, L.RQ_MAXHIT], total, now,
                  tbl[t0 : t0 + total])
    if k < 0:
        return -1  # memory-bound: the head waits for a release (FCFS head-of-line blocking)
    ci[L.KV_AVAIL, r] = available(meta, r)
    ci[L.WQ_HEAD, r] = rq[i, L.RQ_WQ_NEXT]
    if ci[L.WQ_HEAD, r] < 0:
        ci[L.WQ_TAIL, r] = -1
    _account(ci, cf, r, now)
    ci[L.WAITING, r] -= 1
    left = cf[L.QUEUED_PREFILL, r] - rf[i, L.RF_PRED_S]
    cf[L.QUEUED_PREFILL, r] = py_max(left, 0.0) if ci[L.WQ_HEAD, r] >= 0 else 0.0
    ci[L.QUEUED_BLOCKS, r] -= rq[i, L.RQ_PIN] + extra
    if g[L.G_VMODE] == L.V_DELAYED:
        due = now + fp[L.VP_DELAY]
        delayed_push(g, items, dids, r, 1, blocks[k:], due)
        if ne:
            delayed_push(g, items, dids, r, 0, scratch[:ne], due)
    rq[i, L.RQ_CACHED] = block_tokens(k, g[L.G_BLOCK], rq[i, L.RQ_CAP])
    ci[L.RUNNING, r] += 1
    return i


@njit(cache=True)
def _batch_s(fp, rq, batch, nb, decoding):
    """ServingModel.prefill_batch_s: the fixed term once, each prefill's token terms summed."""
    ms, any_new = fp[L.SV_A], False
    for j in range(nb):
        i = batch[j]
        n = rq[i, L.RQ_PROMPT] - rq[i, L.RQ_CACHED]
        if n > 0:
            ms += prefill_ms(0.0, fp[L.SV_B], fp[L.SV_C], fp[L.SV_D], fp[L.SV_E], float(n), float(rq[i, L.RQ_CACHED]))
            any_new = True
    return (py_max(ms, 0.0) / 1000.0 if any_new else 0.0) / share(fp, decoding)


@njit(cache=True)
def _try_start(r, now, off, wb, rq, rf, ci, cf, g, fp, res, kf, sl, slf, meta, evictions, age_sum, hist,
               scratch, tbl, items, dids, ht, hm):
    """Start replica r's next prefill step: its queue head, or with batch_prefills every head that fits."""
    if ci[L.LANE_BUSY, r] or ci[L.WQ_HEAD, r] < 0 or ci[L.RUNNING, r] >= g[L.G_MAX_SEQS]:
        return
    limit = g[L.G_MAX_SEQS] if g[L.G_BATCH] else 1
    decoding = ci[L.DECODING, r]
    room = int(fp[L.SV_BUDGET]) - decoding
    batch = np.empty(limit, dtype=np.int64)
    nb, tokens = 0, 0
    while ci[L.WQ_HEAD, r] >= 0 and ci[L.RUNNING, r] < g[L.G_MAX_SEQS] and nb < limit:
        if nb and tokens + rq[ci[L.WQ_HEAD, r], L.RQ_PROMPT] > room:
            break  # the step's token budget (checked on whole prompts: no chunking)
        i = _admit_head(r, now, off, wb, rq, rf, ci, cf, g, fp, res, kf, sl, slf, meta, evictions, age_sum, hist,
                        scratch, tbl, items, dids)
        if i < 0:
            break
        batch[nb] = i
        nb += 1
        tokens += rq[i, L.RQ_PROMPT]
    if nb == 0:
        return
    if nb == 1:
        i = batch[0]
        dur = prefill_s(fp, rq[i, L.RQ_PROMPT] - rq[i, L.RQ_CACHED], rq[i, L.RQ_CACHED], decoding)
    else:
        dur = _batch_s(fp, rq, batch, nb, decoding)
    ci[L.LANE_BUSY, r] = nb
    cf[L.LANE_UNTIL, r] = now + dur
    for j in range(nb):
        i = batch[j]
        rf[i, L.RF_PRE_S] = dur
        rf[i, L.RF_START] = now
        g[L.G_COUNTER] += 1
        g[L.G_HEAP] = heap_push(ht, hm, g[L.G_HEAP], now + dur, L.PREFILL_DONE, g[L.G_COUNTER], r, i)


@njit(cache=True)
def _release(r, i, now, off, wb, rq, g, fp, res, kf, sl, slf, meta, scratch, tbl, items, dids):
    """Free request i's block table; with cached generation, first hash the blocks its answer filled."""
    s = off[i]
    pin, nb, extra = rq[i, L.RQ_PIN], rq[i, L.RQ_NB], rq[i, L.RQ_EXTRA]
    t0 = rq[i, L.RQ_TOFF]
    table = tbl[t0 : t0 + pin + extra]
    j = rq[i, L.RQ_NXT] if g[L.G_GEN_ON] and pin == nb else -1
    if j >= 0:  # the next turn's blocks this request's answer filled
        sj = off[j]
        m = generated_blocks(wb, s, nb, sj, rq[j, L.RQ_NB], rq[i, L.RQ_PROMPT], rq[i, L.RQ_OUT], g[L.G_BLOCK])
        if m:
            stored = release_gen(res, kf, sl, slf, meta, scratch, r, table, nb, wb[sj + nb : sj + m], now)
            if stored and g[L.G_VMODE] == L.V_DELAYED:
                delayed_push(g, items, dids, r, 1, scratch[:stored], now + fp[L.VP_DELAY])
            return
    release(sl, slf, meta, r, table, now)


@njit(cache=True)
def _scenario(action, rep, now, ci, cf, g, fp, res, kf, sl, meta, scratch, items, dids):
    if action == L.EV_RESTART:
        n = clear_free(res, kf, sl, meta, scratch, rep)
        ci[L.KV_AVAIL, rep] = available(meta, rep)
        if g[L.G_VMODE] == L.V_DELAYED:
            delayed_push(g, items, dids, rep, 0, scratch[:n], now + fp[L.VP_DELAY])
    elif action == L.EV_ADD:
        r = g[L.G_NEXT_ADD]
        ci[L.ACTIVE, r] = 1
        _set_active(ci, g)
        cf[L.LAST_T, r] = now
        g[L.G_NEXT_ADD] = r + 1
    elif ci[L.ACTIVE, rep]:
        if g[L.G_NACT] == 1:
            return  # never remove the last replica: requests would have nowhere to go
        ci[L.ACTIVE, rep] = 0
        _set_active(ci, g)


@njit(cache=True)
def _route(i, now, code, off, wb, rq, rf, cand, ci, cf, g, fp, res, items, dids, dres, last,
           pf, pi, sf, si, pu, uni):
    """Match request i everywhere, let the policy choose, record the decision and queue it; returns r."""
    s, e = off[i], off[i + 1]
    blocks = wb[s:e]
    exact, kb = ci[L.EXACT], ci[L.KB]
    match_all(res, blocks, exact)
    vmode = g[L.G_VMODE]
    if vmode == L.V_DELAYED:
        delayed_advance(g, items, dids, dres, now)
        match_all(dres, blocks, kb)
    elif vmode == L.V_APPROX:
        approx_advance(fp, ci, rq, rf, last, off, wb, now)
        match_all(last, blocks, kb, now - fp[L.VP_TTL])
    else:
        kb[:] = exact
    block, cap, prompt = g[L.G_BLOCK], rq[i, L.RQ_CAP], rq[i, L.RQ_PROMPT]
    for r in range(ci.shape[1]):
        ci[L.CACHEDV, r] = block_tokens(kb[r], block, cap)
    r, reason, pred, nc = choose(code, i, now, e - s, prompt, ci, cf, g, fp, pf, pi, sf, si, pu, uni, cand[i])
    if not ci[L.ACTIVE, r]:
        raise RuntimeError("policy chose an inactive replica")
    rq[i, L.RQ_REPLICA], rq[i, L.RQ_REASON], rq[i, L.RQ_PREDICTED], rq[i, L.RQ_CAND_N] = r, reason, pred, nc
    kmax = exact[r]
    if g[L.G_NACT] > 1:
        kmax = exact[ci[L.ACT, 0]]
        for a in range(1, g[L.G_NACT]):
            kmax = max(kmax, exact[ci[L.ACT, a]])
    rq[i, L.RQ_BEST] = block_tokens(kmax, block, cap)
    kr = exact[r]
    rq[i, L.RQ_ROUTED_K] = kr
    rc = block_tokens(kr, block, cap)
    rq[i, L.RQ_ROUTED] = rc
    rf[i, L.RF_PRED_S] = prefill_s(fp, prompt - rc, rc, ci[L.DECODING, r])
    if vmode == L.V_APPROX:
        approx_route(fp, ci, cf, rq, rf, last, off, wb, r, i, now)
    _account(ci, cf, r, now)
    rq[i, L.RQ_WQ_NEXT] = -1
    if ci[L.WQ_TAIL, r] >= 0:
        rq[ci[L.WQ_TAIL, r], L.RQ_WQ_NEXT] = i
    else:
        ci[L.WQ_HEAD, r] = i
    ci[L.WQ_TAIL, r] = i
    ci[L.INFLIGHT, r] += 1
    ci[L.WAITING, r] += 1
    ci[L.LOAD_BLOCKS, r] += e - s
    ci[L.INFL_OUT, r] += rq[i, L.RQ_OUT]
    cf[L.QUEUED_PREFILL, r] += rf[i, L.RF_PRED_S]
    ci[L.QUEUED_BLOCKS, r] += rq[i, L.RQ_PIN] + rq[i, L.RQ_EXTRA]
    return r


@njit(cache=True)
def run(code, off, wb, rq, rf, cand, ci, cf, g, fp, res_bm, kf, sl, slf, meta, evictions, age_sum, hist,
        scratch, tbl, items, dids, dres_bm, last_bm, ht, hm, pf, pi, sf, si, pu, uni, ev_t, ev_a, ev_r):
    """Replay every request; fills `rq`/`rf`/`cand` and the counters in place, returns the last event time.

    The residency matrices arrive block-major ([block, replica], C order) and are indexed [replica,
    block] through transposed views, so the array types are the same whatever the replica count; the
    approximate view's `last` arrives replica-major.
    """
    res, dres, last = res_bm.T, dres_bm.T, last_bm
    n, n_ev = rq.shape[0], len(ev_t)
    ai, ev_i = np.int64(0), 0  # not a literal 0: numba would compile _route for Literal[int](0) too
    now = 0.0
    while ai < n or g[L.G_HEAP] > 0:
        t_arr = rf[ai, L.RF_ARRIVAL] if ai < n else np.inf
        t_ev = ev_t[ev_i] if ev_i < n_ev else np.inf
        if g[L.G_HEAP] > 0 and ht[0] <= min(t_arr, t_ev):
            now, kind, r, i, size = heap_pop(ht, hm, g[L.G_HEAP])
            g[L.G_HEAP] = size
            dec = 0.0
            if kind == L.PREFILL_DONE:
                rf[i, L.RF_FIRST] = now
                ci[L.LANE_BUSY, r] -= 1
                ci[L.DECODING, r] += 1
                g[L.G_COUNTER] += 1
                dec = _decode_s(fp, rq[i, L.RQ_OUT], ci[L.DECODING, r])
                if dec > 0:
                    g[L.G_HEAP] = heap_push(ht, hm, g[L.G_HEAP], now + dec, L.DECODE_DONE, g[L.G_COUNTER], r, i)
            if kind != L.PREFILL_DONE or dec <= 0:  # nothing to decode: released in its prefill step (engine.py)
                rf[i, L.RF_FINISH] = now
                _release(r, i, now, off, wb, rq, g, fp, res, kf, sl, slf, meta, scratch, tbl, items, dids)
                ci[L.KV_AVAIL, r] = available(meta, r)
                _account(ci, cf, r, now)
                ci[L.DECODING, r] -= 1
                ci[L.RUNNING, r] -= 1
                ci[L.INFLIGHT, r] -= 1
                ci[L.LOAD_BLOCKS, r] -= rq[i, L.RQ_NB]
                ci[L.INFL_OUT, r] -= rq[i, L.RQ_OUT]
        elif t_ev <= t_arr:
            now = t_ev
            _scenario(ev_a[ev_i], ev_r[ev_i], now, ci, cf, g, fp, res, kf, sl, meta, scratch, items, dids)
            ev_i += 1
            continue
        else:
            now = t_arr
            r = _route(ai, now, code, off, wb, rq, rf, cand, ci, cf, g, fp, res, items, dids, dres, last,
                       pf, pi, sf, si, pu, uni)
            ai += 1
        if ci[L.WQ_HEAD, r] >= 0 and not ci[L.LANE_BUSY, r]:  # checked here too: the call itself is not free
            _try_start(r, now, off, wb, rq, rf, ci, cf, g, fp, res, kf, sl, slf, meta, evictions, age_sum, hist,
                       scratch, tbl, items, dids, ht, hm)
    for r in range(ci.shape[1]):
        _account(ci, cf, r, now)
    return now
