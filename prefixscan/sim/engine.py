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
from dataclasses import replace

import numpy as np

from prefixscan.reuse.hitrule import block_tokens
from prefixscan.sim.config import SimConfig
from prefixscan.sim.disagg import Disaggregation
from prefixscan.sim.fast.layout import DECODE_DONE, PREFILL_DONE
from prefixscan.sim.knowledge import make_view
from prefixscan.sim.kvcache import KVState, generated_blocks
from prefixscan.sim.outcome import Outcome, max_hit_blocks, offsets, request_budget
from prefixscan.sim.policies.base import ClusterView, Policy, Req
from prefixscan.sim.tiers import make_tiers
from prefixscan.sim.timing import ServingModel
from prefixscan.sim.workload import Workload

TAKEN = -2  # `just_prefilled` once the loop took that request's instant handoff


def replay(w: Workload, policy: Policy, cfg: SimConfig, serving: ServingModel, capacity: int) -> Outcome:
    """Route every request once and serve it; returns the outcome arrays."""
    return _Replay(w, policy, cfg, serving, capacity).run()


class _Replay:
    """The state of one replay and its event handlers. Per-request constants are plain Python lists:
    indexing numpy arrays in the hot loop costs ~10x more."""

    def __init__(self, w: Workload, policy: Policy, cfg: SimConfig, serving: ServingModel, capacity: int) -> None:
        self.w, self.policy, self.cfg, self.serving = w, policy, cfg, serving
        self.slots = slots = cfg.slots
        self.kv = KVState(slots, w.n_unique, capacity)
        self.tiers = make_tiers(cfg, w.block_size, slots, w.n)
        self.pool = Disaggregation(w, cfg, capacity) if cfg.disaggregated else None
        self.kmode, vopts = policy.view(cfg, w.block_size)
        self.know = make_view(self.kmode, self.kv, **vopts)
        self.cv = ClusterView(slots, serving, self.know, w, capacity, policy.rng(cfg.seed))
        self.cv.set_active(np.arange(cfg.replicas))
        self.cv.kv_available[:] = self.kv.available(0)
        self.B = w.block_size
        self._outcome_arrays(w.n)
        self._budgets(w, cfg, capacity)
        self._replica_state(slots)
        self.exact_buf = np.zeros(slots, dtype=np.int64)
        self.exact_view = self.know.name == "exact"
        # policies with a view of their own (SGLang's tree, approximate modes) never see lower tiers
        self.see_tiers = cfg.router_sees_tiers and self.exact_view
        self.gen_on = cfg.cache_generated and self.pool is None  # a prefill worker never holds the answer
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.counter = 0
        self.events = sorted(cfg.events, key=lambda e: e.time_s)
        self.next_add = cfg.replicas
        self.now = 0.0
        self.just_prefilled = -1  # the request whose prefill ended, while its handoff is being scheduled

    def _outcome_arrays(self, n: int) -> None:
        self.replica = np.full(n, -1, dtype=np.int32)
        self.start, self.first, self.finish = (np.full(n, np.nan) for _ in range(3))  # times: NaN until set
        self.cached, self.predicted, self.best, self.routed = (np.zeros(n, dtype=np.int64) for _ in range(4))
        self.routed_k = np.zeros(n, dtype=np.int32)
        self.pre_s, self.pred_s = np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.float64)
        self.reason = np.zeros(n, dtype=np.int16)
        self.reason_code: dict[str, int] = {}  # reasons in order of first appearance -> their code
        self.cands: list[tuple[int, ...]] = [()] * n
        self.load_l = [0.0] * n  # seconds to load each request's lower-tier blocks (0 without tiers)

    def _budgets(self, w: Workload, cfg: SimConfig, capacity: int) -> None:
        # a prefill worker of a disaggregated fleet computes the prompt only: no decode blocks reserved
        nb, pin_n, extra, self.oversized = request_budget(
            w, replace(cfg, reserve_decode_blocks=False) if self.pool else cfg, capacity)
        toff = offsets(pin_n + extra)
        self.tbl = np.zeros(max(int(toff[-1]), 1), dtype=np.int32)
        self.maxhit_l, self.toff_l = max_hit_blocks(w, pin_n).tolist(), toff.tolist()
        self.off_l, self.pin_l, self.extra_l = w.offsets.tolist(), pin_n.tolist(), extra.tolist()
        self.nb_l, self.prompt_l = nb.tolist(), w.prompt_tokens.tolist()
        self.out_l, self.cap_l = w.output_tokens.tolist(), w.hit_cap.tolist()
        self.tenant_l, self.conv_l = w.tenant.tolist(), w.conv_key.tolist()
        self.nxt_l = w.next_in_conv.tolist()
        self.wb = w.blocks

    def _replica_state(self, slots: int) -> None:
        self.waiting: list[deque[int]] = [deque() for _ in range(slots)]
        self.lane_busy = [0] * slots  # prefills of the step running on each replica
        self.batch_limit = self.cfg.max_num_seqs if self.cfg.batch_prefills else 1
        self.running = [0] * slots
        self.last_t = [0.0] * slots
        self.area_out = [0.0] * slots
        self.area_wait = [0.0] * slots
        self.n_inflight = [0] * slots
        self.n_waiting = [0] * slots

    def account(self, r: int, now: float) -> None:
        dt = now - self.last_t[r]
        if dt > 0:
            self.area_out[r] += dt * self.n_inflight[r]
            self.area_wait[r] += dt * self.n_waiting[r]
            self.last_t[r] = now

    def admit_head(self, r: int, now: float) -> int:
        """Admit replica r's queue head if its blocks fit: its cached tokens; -1 when it must wait."""
        kv, cv, tiers = self.kv, self.cv, self.tiers
        q = self.waiting[r]
        i = q[0]
        s = self.off_l[i]
        pin, maxhit = self.pin_l[i], self.maxhit_l[i]
        blocks = self.wb[s : s + pin]
        if tiers is not None:  # the lookup precedes allocation: what lower tiers hold before any eviction
            nh, ns = tiers.extend(r, blocks, min(kv.match(r, blocks), maxhit), maxhit, now)
        need = pin + self.extra_l[i]
        k, ne = kv.admit(r, blocks, maxhit, need, now, self.tbl[self.toff_l[i] : self.toff_l[i + 1]])
        if k < 0:
            return -1  # memory-bound: the head waits for a release (FCFS head-of-line blocking)
        cv.kv_available[r] = kv.available(r)
        q.popleft()
        self.account(r, now)
        self.n_waiting[r] -= 1
        cv.waiting[r] = self.n_waiting[r]
        cv.queued_prefill_s[r] = max(cv.queued_prefill_s[r] - self.pred_s[i], 0.0) if q else 0.0
        cv.queued_blocks[r] -= need
        self.know.on_store(r, blocks[k:], now)
        if ne:
            self.know.on_evict(r, kv.scratch[:ne], now)
        c = block_tokens(k, self.B, self.cap_l[i])
        if tiers is not None:
            c, self.load_l[i] = tiers.admitted(i, r, blocks, k, nh, ns, self.cap_l[i], kv.scratch[:ne], now)
        self.cached[i] = c
        self.running[r] += 1
        return i

    def _admit_batch(self, r: int, now: float, room: int) -> list[int]:
        """The requests of the next prefill step: the queue head, or with `batch_prefills` every head that
        fits (up to max_num_seqs running, prompts within the step's token budget)."""
        q, prompt_l = self.waiting[r], self.prompt_l
        max_seqs = self.cfg.max_num_seqs
        batch: list[int] = []
        tokens = 0
        while q and self.running[r] < max_seqs and len(batch) < self.batch_limit:
            if batch and tokens + prompt_l[q[0]] > room:
                break  # the step's token budget (checked on whole prompts: no chunking)
            i = self.admit_head(r, now)
            if i < 0:
                break
            batch.append(i)
            tokens += prompt_l[i]
        return batch

    def try_start(self, r: int, now: float) -> None:
        """Start the next prefill step (vLLM's step: one duration for the batch)."""
        if self.lane_busy[r] or not self.waiting[r] or self.running[r] >= self.cfg.max_num_seqs:
            return
        serving, prompt_l, cached, load_l = self.serving, self.prompt_l, self.cached, self.load_l
        decoding = int(self.cv.decoding[r])
        batch = self._admit_batch(r, now, serving.token_budget - decoding)
        if not batch:
            return
        if len(batch) == 1:
            i = batch[0]
            dur = load_l[i] + serving.prefill_s(prompt_l[i] - cached[i], cached[i], decoding)
        else:  # lower-tier loads of one step overlap; the slowest delays the step
            dur = max(load_l[i] for i in batch) + serving.prefill_batch_s(
                [prompt_l[i] - cached[i] for i in batch], [cached[i] for i in batch], decoding)
        self.lane_busy[r] = len(batch)
        self.cv.lane_until[r] = now + dur
        for i in batch:
            self.pre_s[i] = dur
            self.start[i] = now
            self.schedule(now + dur, r, i, PREFILL_DONE)

    def _exact_matches(self, blocks: np.ndarray, i: int, now: float) -> None:
        """Every replica's leading cached blocks for this request, into exact_buf (and the policies' view)."""
        cv, buf = self.cv, self.exact_buf
        self.kv.match_all(blocks, buf)
        if self.see_tiers:  # Dynamo / llm-d score lower-tier residency too
            for a in cv.active_idx.tolist():
                buf[a] += sum(self.tiers.extend(a, blocks, int(buf[a]), len(blocks), now))  # type: ignore[union-attr]  # see_tiers: tiers exist
        if self.exact_view:
            cv._match_buf[:] = buf
            cv._match_for = i

    def route(self, i: int, now: float) -> None:
        cv, B, cap = self.cv, self.B, self.cap_l[i]
        blocks = self.wb[self.off_l[i] : self.off_l[i + 1]]
        req = Req(i, blocks, self.prompt_l[i], self.out_l[i], self.tenant_l[i], self.conv_l[i], now)
        cv.now = now
        self._exact_matches(blocks, i, now)
        d = self.policy.choose(req, cv)
        r = d.replica
        if not cv.active[r]:
            raise RuntimeError(f"policy {self.policy.name} chose inactive replica {r}")
        code = self.reason_code.setdefault(d.reason, len(self.reason_code))
        self.replica[i], self.reason[i], self.cands[i] = r, code, d.candidates
        self.predicted[i] = d.predicted_cached_tokens
        buf = self.exact_buf
        kmax = int(buf[cv.active_idx].max()) if len(cv.active_idx) > 1 else int(buf[r])
        self.best[i] = block_tokens(kmax, B, cap)
        kr = int(buf[r])
        self.routed_k[i] = kr
        rc = block_tokens(kr, B, cap)
        self.routed[i] = rc
        self.pred_s[i] = self.serving.prefill_s(self.prompt_l[i] - rc, rc, int(cv.decoding[r]))
        self.know.on_route(r, blocks, now)
        self._enqueue(r, i, now)
        self.try_start(r, now)

    def _enqueue(self, r: int, i: int, now: float) -> None:
        cv = self.cv
        self.account(r, now)
        self.waiting[r].append(i)
        self.n_inflight[r] += 1
        self.n_waiting[r] += 1
        cv.inflight[r] = self.n_inflight[r]
        cv.waiting[r] = self.n_waiting[r]
        cv.load_blocks[r] += self.nb_l[i]
        cv.inflight_output[r] += self.out_l[i]
        cv.queued_prefill_s[r] += self.pred_s[i]
        cv.queued_blocks[r] += self.pin_l[i] + self.extra_l[i]

    def release(self, r: int, i: int, now: float) -> None:
        kv, wb, off_l, nb_l = self.kv, self.wb, self.off_l, self.nb_l
        s = off_l[i]
        table = self.tbl[self.toff_l[i] : self.toff_l[i + 1]]
        j = self.nxt_l[i] if self.gen_on and self.pin_l[i] == nb_l[i] else -1
        if j >= 0:  # the next turn's blocks this request's answer filled
            nbi, sj = nb_l[i], off_l[j]
            m = generated_blocks(wb, s, nbi, sj, nb_l[j], self.prompt_l[i], self.out_l[i], self.B)
            if m:
                stored = kv.release_gen(r, table, nbi, wb[sj + nbi : sj + m], now)
                if stored:
                    self.know.on_store(r, kv.scratch[:stored].copy(), now)
                    if self.tiers is not None:
                        self.tiers.on_compute(r, kv.scratch[:stored].copy(), now)
                return
        kv.release(r, table, now)

    def scenario(self, ev, now: float) -> None:
        cv = self.cv
        if ev.action == "restart":
            r = ev.replica
            ids = self.kv.scratch[: self.kv.clear_free(r)].copy()
            if self.tiers is not None:
                self.tiers.on_restart(r)
            cv.kv_available[r] = self.kv.available(r)
            self.know.on_clear(r, ids, now)
        elif ev.action == "add":
            cv.set_active(np.append(cv.active_idx, self.next_add))
            self.last_t[self.next_add] = now
            self.next_add += 1
        elif ev.action == "remove" and cv.active[ev.replica]:
            if len(cv.active_idx) == 1:
                return  # never remove the last replica: requests would have nowhere to go
            cv.set_active(cv.active_idx[cv.active_idx != ev.replica])

    def schedule(self, t: float, r: int, i: int, kind: int = DECODE_DONE) -> None:
        """An event: a prefill's end, a decode finish (r: the replica, or slots + decode worker when
        disaggregated) or a disaggregated handoff (r: prefill worker)."""
        self.counter += 1
        heapq.heappush(self.heap, (t, kind, self.counter, r, i))

    def handoff(self, t: float, r: int, i: int) -> None:
        """schedule, except that the instant handoff of the request just prefilled is taken by the loop."""
        if i == self.just_prefilled and t <= self.now:
            self.just_prefilled = TAKEN
        else:
            self.schedule(t, r, i)

    def _prefill_done(self, r: int, i: int, now: float) -> bool:
        """A prefill ended; True when the request is done on this replica (handed off, or nothing to decode)."""
        self.lane_busy[r] -= 1
        if self.pool is not None:
            # an instant handoff frees the prefill blocks before the next admission, as a request with
            # nothing to decode does on a co-located replica
            self.just_prefilled = i
            self.pool.prefilled(i, r, now, self.handoff)
            done = self.just_prefilled == TAKEN
            self.just_prefilled = -1
            return done
        self.first[i] = now
        self.cv.decoding[r] += 1
        dec = self.serving.decode_s(self.out_l[i], int(self.cv.decoding[r]))
        if dec > 0:
            self.schedule(now + dec, r, i)
            return False
        # a request with nothing to decode finishes in its prefill step: vLLM frees its blocks before it
        # schedules the next step, so it is released before the next admission
        return True

    def _leave(self, r: int, i: int, now: float) -> None:
        """Request i is done on replica r: free its blocks (a decode worker takes over when disaggregated)."""
        cv = self.cv
        if self.pool is not None:  # the KV reached the decode worker: free the prefill blocks, decode
            self.kv.release(r, self.tbl[self.toff_l[i] : self.toff_l[i + 1]], now)
            self.first[i] = now
            t_end, d = self.pool.start_decode(i, now, self.serving)
            self.schedule(t_end, self.slots + d, i)
        else:
            self.finish[i] = now
            self.release(r, i, now)
            cv.decoding[r] -= 1
        cv.kv_available[r] = self.kv.available(r)
        self.account(r, now)
        self.running[r] -= 1
        self.n_inflight[r] -= 1
        cv.inflight[r] = self.n_inflight[r]
        cv.load_blocks[r] -= self.nb_l[i]
        cv.inflight_output[r] -= self.out_l[i]

    def _completion(self) -> None:
        now, kind, _, r, i = heapq.heappop(self.heap)
        self.now = now
        if r >= self.slots:
            self.finish[i] = now
            self.pool.decoded(r - self.slots, i, now, self.schedule)  # type: ignore[union-attr]  # a decode slot: disaggregated
            return
        done = self._prefill_done(r, i, now) if kind == PREFILL_DONE else True
        if done:
            self._leave(r, i, now)
        self.try_start(r, now)

    def run(self) -> Outcome:
        n, heap, events = self.w.n, self.heap, self.events
        arrivals = self.w.arrival_s.tolist()
        ai = ev_i = 0
        while ai < n or heap:
            t_arr = arrivals[ai] if ai < n else np.inf
            t_ev = events[ev_i].time_s if ev_i < len(events) else np.inf
            if heap and heap[0][0] <= min(t_arr, t_ev):
                self._completion()
            elif t_ev <= t_arr:
                self.now = t_ev
                self.scenario(events[ev_i], t_ev)
                ev_i += 1
            else:
                self.now = t_arr
                self.route(ai, t_arr)
                ai += 1
        for r in range(self.slots):
            self.account(r, self.now)
        return self.outcome()

    def outcome(self) -> Outcome:
        n, cands, kv, tiers, pool = self.w.n, self.cands, self.kv, self.tiers, self.pool
        cand_off = offsets(np.fromiter(map(len, cands), dtype=np.int64, count=n))
        return Outcome(
            policy=self.policy.name, n_slots=self.slots, replica=self.replica, start_s=self.start,
            first_token_s=self.first, finish_s=self.finish, cached_tokens=self.cached,
            predicted_cached=self.predicted, best_cached=self.best, routed_cached=self.routed,
            routed_blocks=self.routed_k, prefill_s=self.pre_s, reason=self.reason, reasons=list(self.reason_code),
            cand_ids=np.fromiter((r for c in cands for r in c), dtype=np.int32, count=int(cand_off[-1])),
            cand_off=cand_off, evictions=kv.evictions.copy(), evict_age_sum=kv.evict_age_sum.copy(),
            evict_hist=kv.evict_hist.copy(), area_outstanding=np.array(self.area_out),
            area_waiting=np.array(self.area_wait), horizon_s=float(self.now), oversized=self.oversized,
            knowledge=self.kmode, extra=dict(getattr(self.policy, "stats", {})),
            tiers={**(tiers.outcome() if tiers is not None else {}),
                   **(pool.outcome(self.now) if pool is not None else {})},
        )
