"""Event-driven replay of one routing policy over a cluster of replicas.

Events: arrivals (routed on arrival by the policy), prefill completions (first token), decode
completions (blocks released), and scenario events (restart, add, remove). Each replica runs:
- an FCFS waiting queue; the head is admitted when the prefill lane is free, fewer than `max_num_seqs`
  requests run, and its blocks fit (matched blocks are pinned, new ones allocated, evicting LRU free
  blocks lazily; decode blocks are reserved up front). A head that does not fit blocks the queue until a
  request finishes, like vLLM's FCFS scheduler;
- one prefill at a time whose duration comes from `timing.ServingModel` at the current decode load
  (chunked prefill shares the step token budget with running decodes);
- decodes that run concurrently, each at the per-token time of the batch it joined.
The cache lookup happens at admission (engine-actual cached tokens); the router's prediction happens at
arrival from its knowledge view, so the two can differ. See docs/simulator.md for the limits.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from prefixscan.sim.config import SimConfig
from prefixscan.sim.disagg import Disaggregation
from prefixscan.sim.knowledge import make_view
from prefixscan.sim.kvcache import KVState
from prefixscan.sim.policies.base import ClusterView, Policy, Req
from prefixscan.sim.tiers import make_tiers
from prefixscan.sim.timing import ServingModel
from prefixscan.sim.workload import Workload

DECODE_DONE, PREFILL_DONE = 0, 1  # at equal times, completions free resources before later work


@dataclass
class Outcome:
    """Per-request arrays (workload order) and per-replica counters of one policy's replay."""

    policy: str
    n_slots: int
    replica: np.ndarray
    start_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    cached_tokens: np.ndarray
    predicted_cached: np.ndarray
    best_cached: np.ndarray  # most cached tokens any active replica held at routing (exact)
    routed_cached: np.ndarray  # cached tokens the chosen replica held at routing (exact)
    routed_blocks: np.ndarray  # leading blocks the chosen replica held at routing (exact)
    prefill_s: np.ndarray
    reason: np.ndarray  # int16 code into `reasons`
    reasons: list[str]
    cand_ids: np.ndarray  # int32: every request's candidate replicas, best first, concatenated
    cand_off: np.ndarray  # int64 [n + 1]: request i's candidates are cand_ids[cand_off[i]:cand_off[i + 1]]
    evictions: np.ndarray
    evict_age_sum: np.ndarray
    evict_hist: np.ndarray
    area_outstanding: np.ndarray  # integral of in-flight requests over time, per replica
    area_waiting: np.ndarray
    horizon_s: float
    oversized: int
    knowledge: str
    extra: dict = field(default_factory=dict)
    tiers: dict = field(default_factory=dict)  # per-request tier / disaggregation arrays and counters

    @property
    def candidates(self) -> list[tuple[int, ...]]:
        """Per-request candidate tuples (the decision log's `candidate_replicas`)."""
        ids, off = self.cand_ids.tolist(), self.cand_off.tolist()
        return [tuple(ids[off[i] : off[i + 1]]) for i in range(len(off) - 1)]


def _capacity(cfg: SimConfig, w: Workload) -> int:
    if cfg.unbounded_kv:
        # every block any request could pin at once, so nothing is ever evicted
        return int(w.offsets[-1]) + int(w.output_tokens.sum() // max(w.block_size, 1)) + 2 * w.n + 1
    if cfg.kv_blocks is not None:
        return int(cfg.kv_blocks)
    from prefixscan.sim.timing import kv_capacity_blocks

    return kv_capacity_blocks(
        cfg.model, cfg.gpu, cfg.dtype, w.block_size, cfg.tensor_parallel, cfg.gpu_memory_utilization
    )


def request_budget(w: Workload, cfg: SimConfig, capacity: int) -> tuple[np.ndarray, ...]:
    """(listed blocks, pinned prompt blocks, other blocks of the table, oversized count) per request.

    A request's block table (vLLM's block pool, `kvcache.py`) holds its full prompt blocks (truncated if
    they exceed a whole replica, whose block 0 is the null block), then its partial last prompt block
    and, with `reserve_decode_blocks`, the blocks of the tokens it computes while decoding: vLLM computes
    the KV of prompt + output - 1 tokens (the last generated token is never fed back).
    """
    usable = max(capacity - 1, 0)
    nb = np.diff(w.offsets)
    computed = w.prompt_tokens + (np.maximum(w.output_tokens - 1, 0) if cfg.reserve_decode_blocks else 0)
    total = np.maximum(nb, -(-computed // w.block_size))
    pin_n = np.minimum(nb, usable)
    extra = np.minimum(total - nb, usable - pin_n)
    return nb, pin_n, extra, int((nb > usable).sum())


def max_hit_blocks(w: Workload, pin: np.ndarray) -> np.ndarray:
    """Most leading blocks a request's lookup may use: its hit cap in whole blocks (vLLM stops at
    floor((n-1)/B) blocks; a trace's partial last block may hit), within its pinned blocks."""
    return np.minimum(pin, -(-w.hit_cap // max(w.block_size, 1)))


def table_offsets(pin: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """Where each request's block table starts in one flat int32 array (the last entry is its size)."""
    off = np.zeros(len(pin) + 1, dtype=np.int64)
    np.cumsum(pin + extra, out=off[1:])
    return off


def generated_blocks(prompt: int, output: int, block_size: int) -> int:
    """Full blocks a finished request's KV covers: prompt + output - 1 tokens (the last generated token's
    KV is never computed)."""
    return max(prompt + output - 1, 0) // block_size


def replay(w: Workload, policy: Policy, cfg: SimConfig, serving: ServingModel, capacity: int) -> Outcome:
    """Route every request once and serve it; returns the outcome arrays."""
    n_add = sum(1 for e in cfg.events if e.action == "add")
    slots = cfg.replicas + n_add
    kv = KVState(slots, w.n_unique, capacity)
    tiers = make_tiers(cfg, w.block_size, slots, w.n)
    pool = Disaggregation(w, cfg, capacity) if cfg.disaggregated else None
    kmode = policy.knowledge_mode(cfg.knowledge)
    vopts = {"delay_s": cfg.event_delay_s, "ttl_s": cfg.approx_ttl_s}
    vopts.update(policy.view_options())
    know = make_view(kmode, kv, **vopts)
    rng = np.random.default_rng([cfg.seed, sum(map(ord, policy.name))])
    cv = ClusterView(slots, serving, know, w, capacity, rng)
    cv.set_active(np.arange(cfg.replicas))
    cv.kv_available[:] = kv.available(0)
    n = w.n
    B = w.block_size
    replica = np.full(n, -1, dtype=np.int32)
    start = np.full(n, np.nan)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    cached = np.zeros(n, dtype=np.int64)
    predicted = np.zeros(n, dtype=np.int64)
    best = np.zeros(n, dtype=np.int64)
    routed = np.zeros(n, dtype=np.int64)
    routed_k = np.zeros(n, dtype=np.int32)
    pre_s = np.zeros(n, dtype=np.float64)
    pred_s = np.zeros(n, dtype=np.float64)
    reason = np.zeros(n, dtype=np.int16)
    reasons: list[str] = []
    reason_code: dict[str, int] = {}
    cands: list[tuple[int, ...]] = [()] * n
    # a prefill worker of a disaggregated fleet computes the prompt only: no decode blocks reserved
    nb, pin_n, extra, oversized = request_budget(w, replace(cfg, reserve_decode_blocks=False) if pool else cfg,
                                                 capacity)
    toff = table_offsets(pin_n, extra)
    tbl = np.zeros(max(int(toff[-1]), 1), dtype=np.int32)
    maxhit_l, toff_l = max_hit_blocks(w, pin_n).tolist(), toff.tolist()
    # plain Python lists for per-request constants: indexing numpy arrays in the hot loop costs ~10x more
    off_l, pin_l, extra_l, nb_l = w.offsets.tolist(), pin_n.tolist(), extra.tolist(), nb.tolist()
    prompt_l, out_l, cap_l = w.prompt_tokens.tolist(), w.output_tokens.tolist(), w.hit_cap.tolist()
    tenant_l, conv_l = w.tenant.tolist(), w.conv_key.tolist()
    wb = w.blocks
    waiting: list[deque[int]] = [deque() for _ in range(slots)]
    lane_busy = [0] * slots  # prefills of the step running on each replica
    load_l = [0.0] * n  # seconds to load each request's lower-tier blocks (0 without tiers)
    batch_limit = cfg.max_num_seqs if cfg.batch_prefills else 1
    running = [0] * slots
    last_t = [0.0] * slots
    area_out = [0.0] * slots
    area_wait = [0.0] * slots
    n_inflight = [0] * slots
    n_waiting = [0] * slots
    exact_buf = np.zeros(slots, dtype=np.int64)
    exact_view = kmode == "exact" or (kmode == "delayed" and cfg.event_delay_s == 0)
    heap: list[tuple[float, int, int, int, int]] = []
    counter = 0
    events = sorted(cfg.events, key=lambda e: e.time_s)
    ev_i = 0
    next_add = cfg.replicas
    max_seqs = cfg.max_num_seqs
    push = heapq.heappush

    def account(r: int, now: float) -> None:
        dt = now - last_t[r]
        if dt > 0:
            area_out[r] += dt * n_inflight[r]
            area_wait[r] += dt * n_waiting[r]
            last_t[r] = now

    def admit_head(r: int, now: float) -> int:
        """Admit replica r's queue head if its blocks fit: its cached tokens; -1 when it must wait."""
        q = waiting[r]
        i = q[0]
        s = off_l[i]
        blocks = wb[s : s + pin_l[i]]
        if tiers is not None:  # the lookup precedes allocation: what lower tiers hold before any eviction
            nh, ns = tiers.extend(r, blocks, min(kv.match(r, blocks), maxhit_l[i]), maxhit_l[i], now)
        k, ne = kv.admit(r, blocks, maxhit_l[i], pin_l[i] + extra_l[i], now, tbl[toff_l[i] : toff_l[i + 1]])
        if k < 0:
            return -1  # memory-bound: the head waits for a release (FCFS head-of-line blocking)
        cv.kv_available[r] = kv.available(r)
        q.popleft()
        account(r, now)
        n_waiting[r] -= 1
        cv.waiting[r] = n_waiting[r]
        cv.queued_prefill_s[r] = max(cv.queued_prefill_s[r] - pred_s[i], 0.0) if q else 0.0
        cv.queued_blocks[r] -= pin_l[i] + extra_l[i]
        know.on_store(r, blocks[k:], now)
        if ne:
            know.on_evict(r, kv.scratch[:ne], now)
        c = min(k * B, cap_l[i])
        if tiers is not None:
            c, load_l[i] = tiers.admitted(i, r, blocks, k, nh, ns, cap_l[i], kv.scratch[:ne], now)
        cached[i] = c
        running[r] += 1
        return i

    def try_start(r: int, now: float) -> None:
        """Start the next prefill step: the queue head, or with `batch_prefills` every head that fits
        (vLLM's step: up to max_num_seqs running, prompts within the token budget; one duration)."""
        nonlocal counter
        q = waiting[r]
        if lane_busy[r] or not q or running[r] >= max_seqs:
            return
        decoding = int(cv.decoding[r])
        room = serving.token_budget - decoding
        batch: list[int] = []
        tokens = 0
        while q and running[r] < max_seqs and len(batch) < batch_limit:
            if batch and tokens + prompt_l[q[0]] > room:
                break  # the step's token budget (checked on whole prompts: no chunking)
            i = admit_head(r, now)
            if i < 0:
                break
            batch.append(i)
            tokens += prompt_l[i]
        if not batch:
            return
        if len(batch) == 1:
            i = batch[0]
            dur = load_l[i] + serving.prefill_s(prompt_l[i] - cached[i], cached[i], decoding)
        else:  # lower-tier loads of one step overlap; the slowest delays the step
            dur = max(load_l[i] for i in batch) + serving.prefill_batch_s(
                [prompt_l[i] - cached[i] for i in batch], [cached[i] for i in batch], decoding)
        lane_busy[r] = len(batch)
        cv.lane_until[r] = now + dur
        for i in batch:
            pre_s[i] = dur
            start[i] = now
            counter += 1
            push(heap, (now + dur, PREFILL_DONE, counter, r, i))

    def route(i: int, now: float) -> None:
        s, e = off_l[i], off_l[i + 1]
        blocks = wb[s:e]
        req = Req(i, blocks, prompt_l[i], out_l[i], tenant_l[i], conv_l[i], now)
        cv.now = now
        kv.match_all(blocks, exact_buf)
        if see_tiers:  # Dynamo / llm-d score lower-tier residency too
            for a in cv.active_idx.tolist():
                exact_buf[a] += sum(tiers.extend(a, blocks, int(exact_buf[a]), len(blocks), now))
        if exact_view:
            cv._match_buf[:] = exact_buf
            cv._match_for = i
        d = policy.choose(req, cv)
        r = d.replica
        if not cv.active[r]:
            raise RuntimeError(f"policy {policy.name} chose inactive replica {r}")
        code = reason_code.get(d.reason)
        if code is None:
            code = reason_code[d.reason] = len(reasons)
            reasons.append(d.reason)
        replica[i], reason[i], cands[i], predicted[i] = r, code, d.candidates, d.predicted_cached_tokens
        kmax = int(exact_buf[cv.active_idx].max()) if len(cv.active_idx) > 1 else int(exact_buf[r])
        best[i] = min(kmax * B, cap_l[i])
        kr = int(exact_buf[r])
        routed_k[i] = kr
        rc = min(kr * B, cap_l[i])
        routed[i] = rc
        pred_s[i] = serving.prefill_s(prompt_l[i] - rc, rc, int(cv.decoding[r]))
        know.on_route(r, blocks, now)
        account(r, now)
        waiting[r].append(i)
        n_inflight[r] += 1
        n_waiting[r] += 1
        cv.inflight[r] = n_inflight[r]
        cv.waiting[r] = n_waiting[r]
        cv.load_blocks[r] += nb_l[i]
        cv.inflight_output[r] += out_l[i]
        cv.queued_prefill_s[r] += pred_s[i]
        cv.queued_blocks[r] += pin_l[i] + extra_l[i]
        try_start(r, now)

    nxt_l = w.next_in_conv.tolist()
    gen_on = cfg.cache_generated and pool is None  # a prefill worker never holds the answer
    # policies with a view of their own (SGLang's tree, approximate modes) never see lower tiers
    see_tiers = cfg.router_sees_tiers and exact_view

    def release(r: int, i: int, now: float) -> None:
        s = off_l[i]
        table = tbl[toff_l[i] : toff_l[i + 1]]
        j = nxt_l[i] if gen_on and pin_l[i] == nb_l[i] else -1
        if j >= 0:
            # the next turn's blocks inside this request's prompt + output are what it generated, provided
            # that turn extends this prompt (chained hashes: equal last block <=> equal prefix)
            nbi, sj = nb_l[i], off_l[j]
            m = min(nb_l[j], generated_blocks(prompt_l[i], out_l[i], B))
            if m > nbi and (nbi == 0 or wb[sj + nbi - 1] == wb[s + nbi - 1]):
                stored = kv.release_gen(r, table, nbi, wb[sj + nbi : sj + m], now)
                if stored:
                    know.on_store(r, kv.scratch[:stored].copy(), now)
                    if tiers is not None:
                        tiers.on_compute(r, kv.scratch[:stored].copy(), now)
                return
        kv.release(r, table, now)

    def scenario(ev, now: float) -> None:  # noqa: ANN001
        nonlocal next_add
        if ev.action == "restart":
            r = ev.replica
            ids = kv.scratch[: kv.clear_free(r)].copy()
            if tiers is not None:
                tiers.on_restart(r)
            cv.kv_available[r] = kv.available(r)
            know.on_clear(r, ids, now)
        elif ev.action == "add":
            cv.set_active(np.append(cv.active_idx, next_add))
            last_t[next_add] = now
            next_add += 1
        elif ev.action == "remove" and cv.active[ev.replica]:
            if len(cv.active_idx) == 1:
                return  # never remove the last replica: requests would have nowhere to go
            cv.set_active(cv.active_idx[cv.active_idx != ev.replica])

    def schedule(t: float, r: int, i: int) -> None:
        """A disaggregated handoff (r: prefill worker) or decode finish (r: slots + decode worker)."""
        nonlocal counter
        counter += 1
        push(heap, (t, DECODE_DONE, counter, r, i))

    TAKEN = -2
    just_prefilled = [-1]  # the request whose prefill ended, while its handoff is being scheduled

    def handoff(t: float, r: int, i: int) -> None:
        """schedule, except that the instant handoff of the request just prefilled is taken by the loop."""
        if i == just_prefilled[0] and t <= now:
            just_prefilled[0] = TAKEN
        else:
            schedule(t, r, i)

    ai = 0
    now = 0.0
    arrivals = w.arrival_s.tolist()
    while ai < n or heap:
        t_arr = arrivals[ai] if ai < n else np.inf
        t_ev = events[ev_i].time_s if ev_i < len(events) else np.inf
        if heap and heap[0][0] <= min(t_arr, t_ev):
            now, kind, _, r, i = heapq.heappop(heap)
            if r >= slots:
                finish[i] = now
                pool.decoded(r - slots, i, now, schedule)
                continue
            done = kind != PREFILL_DONE
            if kind == PREFILL_DONE:
                lane_busy[r] -= 1
                if pool is not None:
                    # an instant handoff frees the prefill blocks before the next admission, as a request
                    # with nothing to decode does on a co-located replica
                    just_prefilled[0] = i
                    pool.prefilled(i, r, now, handoff)
                    done = just_prefilled[0] == TAKEN
                    just_prefilled[0] = -1
                else:
                    first[i] = now
                    cv.decoding[r] += 1
                    dec = serving.decode_s(out_l[i], int(cv.decoding[r]))
                    if dec > 0:
                        counter += 1
                        push(heap, (now + dec, DECODE_DONE, counter, r, i))
                    else:
                        # a request with nothing to decode finishes in its prefill step: vLLM frees its
                        # blocks before it schedules the next step, so it is released before the next admission
                        done = True
            if done:
                if pool is not None:  # the KV reached the decode worker: free the prefill blocks, decode
                    kv.release(r, tbl[toff_l[i] : toff_l[i + 1]], now)
                    first[i] = now
                    t_end, d = pool.start_decode(i, now, serving)
                    schedule(t_end, slots + d, i)
                else:
                    finish[i] = now
                    release(r, i, now)
                    cv.decoding[r] -= 1
                cv.kv_available[r] = kv.available(r)
                account(r, now)
                running[r] -= 1
                n_inflight[r] -= 1
                cv.inflight[r] = n_inflight[r]
                cv.load_blocks[r] -= nb_l[i]
                cv.inflight_output[r] -= out_l[i]
            try_start(r, now)
        elif t_ev <= t_arr:
            now = t_ev
            scenario(events[ev_i], now)
            ev_i += 1
        else:
            now = t_arr
            route(ai, now)
            ai += 1
    for r in range(slots):
        account(r, now)
    cand_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, cands), dtype=np.int64, count=n), out=cand_off[1:])
    return Outcome(
        policy=policy.name,
        n_slots=slots,
        replica=replica,
        start_s=start,
        first_token_s=first,
        finish_s=finish,
        cached_tokens=cached,
        predicted_cached=predicted,
        best_cached=best,
        routed_cached=routed,
        routed_blocks=routed_k,
        prefill_s=pre_s,
        reason=reason,
        reasons=reasons,
        cand_ids=np.fromiter((r for c in cands for r in c), dtype=np.int32, count=int(cand_off[-1])),
        cand_off=cand_off,
        evictions=kv.evictions.copy(),
        evict_age_sum=kv.evict_age_sum.copy(),
        evict_hist=kv.evict_hist.copy(),
        area_outstanding=np.array(area_out),
        area_waiting=np.array(area_wait),
        horizon_s=float(now),
        oversized=oversized,
        knowledge=kmode,
        extra=dict(getattr(policy, "stats", {})),
        tiers={**(tiers.outcome() if tiers is not None else {}), **(pool.outcome(now) if pool is not None else {})},
    )

