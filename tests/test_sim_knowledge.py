"""Router knowledge views: delayed events replay the past exactly; the approximate view is an exact LRU."""

from __future__ import annotations

import numpy as np
import pytest

from prefixscan.sim.knowledge import ApproxView, DelayedView
from prefixscan.sim.kvcache import KVState
from tests.test_sim_kvcache import random_chains


def test_delayed_view_is_the_past_state() -> None:
    rng = np.random.default_rng(0)
    reqs = random_chains(rng, 80)
    n_blocks = 1 + max(b for r in reqs for b in r)
    kv = KVState(1, n_blocks, 30)
    view = DelayedView(kv, delay_s=5.0)
    snapshots: dict[float, np.ndarray] = {}
    running: list[np.ndarray] = []  # block tables of running requests
    out = np.zeros(1, dtype=np.int64)
    for t, path in enumerate(reqs):
        now = float(t)
        blocks = np.array(path, dtype=np.int32)
        if len(running) > 2:
            kv.release(0, running.pop(0), now)
        table = np.zeros(len(blocks), dtype=np.int32)
        k, ne = kv.admit(0, blocks, len(blocks), len(blocks), now, table)
        if k >= 0:
            view.on_store(0, blocks[k:], now)
            view.on_evict(0, kv.scratch[:ne], now)
            running.append(table)
        snapshots[now] = kv.res[0].copy()
        if now >= 5:
            view.advance(now)
            assert (view.res[0] == snapshots[now - 5]).all()
            for p in reqs[:20]:
                b = np.array(p, dtype=np.int32)
                view.match(b, now, out)
                expect = 0
                while expect < len(p) and snapshots[now - 5][p[expect]]:
                    expect += 1
                assert out[0] == expect


@pytest.mark.parametrize("cap,ttl", [(15, np.inf), (40, np.inf), (10**6, 7.0)])
def test_approx_view_matches_bruteforce_lru(cap: int, ttl: float) -> None:
    rng = np.random.default_rng(1)
    reqs = random_chains(rng, 150, branching=3)
    n_blocks = 1 + max(b for r in reqs for b in r)
    kv = KVState(1, n_blocks, 10)
    view = ApproxView(kv, ttl_s=ttl, max_blocks=cap)
    last: dict[int, tuple[float, int]] = {}  # brute force: block -> (time, order) of its latest routing
    out = np.zeros(1, dtype=np.int64)
    for t, path in enumerate(reqs):
        now = float(t // 2)  # equal times happen
        live = {b for b, lt in last.items() if lt[0] > now - ttl}
        k = 0
        while k < len(path) and path[k] in live:
            k += 1
        view.match(np.array(path, dtype=np.int32), now, out)
        assert out[0] == k
        view.on_route(0, np.array(path, dtype=np.int32), now)
        for b in path:
            last[b] = (now, t)
        for b in [b for b, lt in last.items() if lt[0] <= now - ttl]:
            del last[b]
        live = sorted((lt, b) for b, lt in last.items())
        while len(live) > cap:  # drop the oldest routing record's blocks together
            oldest = live[0][0]
            for lt, b in list(live):
                if lt == oldest:
                    del last[b]
            live = [(lt, b) for lt, b in live if lt != oldest]
        assert view.size(0) == len(live) == int((view.last[0] > now - ttl).sum())
