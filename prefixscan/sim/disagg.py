"""Prefill/decode disaggregation: the decode pool a prefill worker hands each request to.

Routing becomes two decisions (REFERENCE.md 14). The prefill pool is the replay's replicas, routed by
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

import numpy as np


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
        """Blocks a request's decode holds: its whole KV (prompt + output - 1 tokens), at most a worker."""
        return min(-(-max(prompt + output - 1, 1) // block_size), self.usable)

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
