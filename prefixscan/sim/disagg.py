"""Prefill/decode disaggregation: the decode pool a prefill worker hands each request to.

Routing becomes two decisions (docs/engines.md). The prefill pool is the replay's replicas, routed by
any policy; a prefill worker computes only the prompt (no decode blocks reserved; vLLM's P/D runs the
prefill with max_tokens=1). When its prefill ends the request joins the decode queue (FIFO); its head is
placed on the decode worker with the most free KV blocks among those with a free sequence slot (fewest
running breaks ties, then the lowest id: placement by load and KV memory), which reserves the blocks of
prompt + output - 1 tokens. The prompt's KV then crosses the prefill-to-decode link
(`timing.transfer_s`: bytes / bandwidth + latency, NIXL over RDMA by default); the prefill worker keeps
its blocks (and the head of the decode queue waits) until the transfer ends. The first token is the
decode worker's first step after the transfer, so TTFT includes queueing for decode and the transfer.
The decode pool keeps no prefix cache of its own (its blocks are freed at finish).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from prefixscan.sim.kvcache import kv_tokens

if TYPE_CHECKING:
    from prefixscan.sim.config import SimConfig


class DecodePool:
    """D decode workers: free KV blocks, running sequences, the FIFO decode queue and time integrals."""

    def __init__(self, n: int, capacity: int, max_seqs: int) -> None:
        self.n = n
        self.usable = max(capacity - 1, 1)  # block 0 is the null block
        self.free = [self.usable] * n
        self.running = [0] * n  # placed (transfer or decode)
        self.decoding = [0] * n  # decoding now (the batch a new sequence joins)
        self.max_seqs = max_seqs
        self.queue: deque[tuple[int, int]] = deque()  # (request, prefill replica)
        self.last_t = 0.0
        self.area_running = np.zeros(n)
        self.area_blocks = np.zeros(n)
        self.area_queue = 0.0
        self.peak_queue = 0

    def account(self, now: float) -> None:
        dt = now - self.last_t
        if dt > 0:
            self.area_running += dt * np.asarray(self.running, dtype=np.float64)
            self.area_blocks += dt * (self.usable - np.asarray(self.free, dtype=np.float64))
            self.area_queue += dt * len(self.queue)
            self.last_t = now

    def need(self, prompt: int, output: int, block_size: int) -> int:
        """Blocks a request's decode holds: its whole KV (`kv_tokens`), at least one block, at most a worker."""
        return min(-(-max(kv_tokens(prompt, output), 1) // block_size), self.usable)

    def place(self, need: int) -> int:
        """The decode worker for a request needing `need` blocks, or -1 when none has room."""
        best, key = -1, None
        for d in range(self.n):
            if self.free[d] >= need and self.running[d] < self.max_seqs:
                k = (-self.free[d], self.running[d], d)
                if key is None or k < key:
                    best, key = d, k
        if best >= 0:
            self.free[best] -= need
            self.running[best] += 1
        return best

    def release(self, d: int, need: int) -> None:
        self.free[d] += need
        self.running[d] -= 1

    def enqueue(self, i: int, r: int, now: float) -> None:
        self.account(now)
        self.queue.append((i, r))
        self.peak_queue = max(self.peak_queue, len(self.queue))


class Disaggregation:
    """The prefill-to-decode handoff of one replay: the decode pool plus per-request arrays.

    The engine calls `prefilled` when a prefill ends, `start_decode` when the transfer it scheduled ends
    (after freeing the prefill worker's blocks) and `decoded` when a decode worker finishes;
    `schedule(time, slot, request)` puts a handoff or finish event on the engine's heap.
    """

    def __init__(self, w: Any, cfg: SimConfig, capacity: int) -> None:
        from prefixscan.sim.tiers import link_gbs
        from prefixscan.sim.timing import kv_bytes_per_token

        self.pool = DecodePool(cfg.decode_replicas, cfg.decode_kv_blocks or capacity, cfg.max_num_seqs)
        self.prompt, self.out = w.prompt_tokens.tolist(), w.output_tokens.tolist()
        self.need = [self.pool.need(p, o, w.block_size) for p, o in zip(self.prompt, self.out, strict=True)]
        self.bpt = kv_bytes_per_token(cfg.model, cfg.dtype, cfg.tensor_parallel)
        self.gbs, self.latency = link_gbs(cfg.pd_link), cfg.pd_latency_s
        n = w.n
        self.decode_replica = np.full(n, -1, np.int32)
        self.decode_wait = np.full(n, np.nan)
        self.transfer = np.zeros(n)
        self.prefill_done = np.full(n, np.nan)

    def prefilled(self, i: int, r: int, now: float, schedule: Callable[[float, int, int], None]) -> None:
        """Request i's prefill on prefill worker r ended: it joins the decode queue."""
        self.prefill_done[i] = now
        self.pool.enqueue(i, r, now)
        self.drain(now, schedule)

    def drain(self, now: float, schedule: Callable[[float, int, int], None]) -> None:
        """Place the decode queue's head while a decode worker has room; schedule its KV transfer."""
        from prefixscan.sim.timing import transfer_s

        pool = self.pool
        pool.account(now)
        q = pool.queue
        while q:
            i, r = q[0]
            d = pool.place(self.need[i])
            if d < 0:
                return  # FIFO: the head waits for a decode worker to free memory or a slot
            q.popleft()
            self.decode_replica[i] = d
            self.decode_wait[i] = now - self.prefill_done[i]
            tx = self.transfer[i] = transfer_s(self.prompt[i], self.bpt, self.gbs, self.latency)
            schedule(now + tx, r, i)

    def start_decode(self, i: int, now: float, serving: Any) -> tuple[float, int]:
        """The KV reached the decode worker: (finish time, decode worker)."""
        d = int(self.decode_replica[i])
        self.pool.account(now)
        self.pool.decoding[d] += 1
        return now + serving.decode_s(self.out[i], self.pool.decoding[d]), d

    def decoded(self, d: int, i: int, now: float, schedule: Callable[[float, int, int], None]) -> None:
        self.pool.account(now)
        self.pool.decoding[d] -= 1
        self.pool.release(d, self.need[i])
        self.drain(now, schedule)

    def outcome(self, now: float) -> dict:
        """Per-request arrays and pool counters for `Outcome.tiers`."""
        pool = self.pool
        pool.account(now)
        return {
            "decode_replica": self.decode_replica,
            "decode_wait_s": self.decode_wait,
            "transfer_s": self.transfer,
            "prefill_done_s": self.prefill_done,
            "decode_area_running": pool.area_running.copy(),
            "decode_area_blocks": pool.area_blocks.copy(),
            "decode_area_queue": pool.area_queue,
            "decode_queue_peak": pool.peak_queue,
            "decode_usable_blocks": pool.usable,
            "decode_max_seqs": pool.max_seqs,
        }
