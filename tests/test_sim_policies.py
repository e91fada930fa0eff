"""Each policy's rule on hand-built cluster states (one warm replica, queues set by hand)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from prefixscan.sim.knowledge import ExactView
from prefixscan.sim.kvcache import KVState
from prefixscan.sim.policies import make_policy
from prefixscan.sim.policies.base import ClusterView, Req
from prefixscan.sim.timing import ServingModel, preble_fit
from prefixscan.sim.workload import build_workload
from tests.sim_tables import chain

B = 16


def cluster(n: int = 3) -> tuple[ClusterView, Req, Req]:
    """Replica 1 holds a 64-block document; `warm` extends it, `cold` shares nothing."""
    doc = list(range(64))
    rows = [doc, doc + [1000, 1001], [2000 + j for j in range(10)]]
    table = pa.table(
        {
            "seq": list(range(3)),
            "request_id": ["a", "b", "c"],
            "arrival_s": [0.0, 1.0, 2.0],
            "conversation_id": ["x", "y", "z"],
            "prompt_tokens": [len(r) * B + 5 for r in rows],
            "output_tokens": [10, 10, 10],
            "block_hashes": pa.array([chain(r) for r in rows], pa.list_(pa.uint64())),
        }
    )
    w = build_workload(table, B)
    kv = KVState(n, w.n_unique, 1000)
    first = w.blocks[w.offsets[0] : w.offsets[1]]
    table = np.zeros(len(first), dtype=np.int32)
    kv.admit(1, first, len(first), len(first), 0.0, table)
    kv.release(1, table, 0.5)
    view = ClusterView(n, ServingModel(preble_fit()), ExactView(kv), w, 1000, np.random.default_rng(0))
    view.set_active(np.arange(n))
    view.now = 1.0

    def req(i: int) -> Req:
        blocks = w.blocks[w.offsets[i] : w.offsets[i + 1]]
        return Req(i, blocks, int(w.prompt_tokens[i]), 10, -1, int(w.conv_key[i]), 1.0)

    return view, req(1), req(2)


def choose(name: str, view: ClusterView, r: Req, **params: object):
    return make_policy(name, {k: str(v) for k, v in params.items()}, 0).choose(r, view)


def test_cost_based_prefers_warm_then_leaves_it_when_the_wait_is_too_long() -> None:
    view, warm, cold = cluster()
    d = choose("cost_based", view, warm)
    assert (d.replica, d.reason) == (1, "prefer-warm-worker") and d.predicted_cached_tokens == 64 * B
    view.queued_prefill_s[1] = 5.0  # a long queue in front of the warm replica
    d = choose("cost_based", view, warm, max_warm_wait_s=2.0)
    assert d.replica != 1 and d.reason == "warm-wait-exceeded"
    d = choose("cost_based", view, warm, max_warm_wait_s=10.0)
    assert d.replica != 1 and d.reason == "warm-too-slow"  # 5 s of queue costs more than the prefill saved
    view.queued_prefill_s[1] = 0.05  # a short queue: still worth it
    assert choose("cost_based", view, warm).replica == 1


def test_cost_based_cold_pool_takes_only_cold_requests() -> None:
    view, warm, cold = cluster()
    assert choose("cost_based", view, cold, cold_pool=1).replica == 2
    d = choose("cost_based", view, cold, cold_pool=1)
    assert d.reason == "cold-pool"
    assert choose("cost_based", view, warm, cold_pool=1).replica == 1


def test_dynamo_cost_is_uncached_blocks_plus_active_blocks() -> None:
    view, warm, _ = cluster()
    assert choose("dynamo_kv", view, warm).replica == 1
    view.load_blocks[:] = [0, 100, 0]  # 100 active blocks outweigh 64 cached ones
    assert choose("dynamo_kv", view, warm).replica == 0
    view.load_blocks[:] = [5, 0, 3]
    assert choose("dynamo_kv", view, warm, overlap_score_weight=0).replica == 1  # pure load balance


def test_sglang_rules() -> None:
    view, warm, cold = cluster()
    d = choose("sglang_cache_aware", view, warm, knowledge="exact")
    assert (d.replica, d.reason) == (1, "cache-match")
    view.inflight[:] = [10, 200, 30]  # imbalanced: 190 > 64 and 200 > 1.5 * 10
    d = choose("sglang_cache_aware", view, warm, knowledge="exact")
    assert (d.replica, d.reason) == (0, "imbalanced-least-load")
    view.inflight[:] = [10, 50, 30]  # balanced again; the cold request goes to the smallest tree
    assert choose("sglang_cache_aware", view, cold, knowledge="exact").reason == "smallest-tree"


def test_llmd_weighted_scores() -> None:
    view, warm, _ = cluster()
    assert choose("llmd_weighted", view, warm, knowledge="exact").replica == 1  # prefix score 3 wins
    view.waiting[:] = [0, 9, 0]
    view.kv_available[:] = [1000, 10, 1000]  # warm replica: worst queue (0) and almost full (kv 0.02)
    assert choose("llmd_weighted", view, warm, knowledge="exact").replica != 1


def test_preble_exploits_then_explores() -> None:
    view, warm, cold = cluster()
    d = choose("preble_e2", view, warm)
    assert (d.replica, d.reason) == (1, "exploit")
    assert choose("preble_e2", view, cold).reason == "explore"


def test_chwbl_skips_full_replicas_and_oracle_takes_least_ttft() -> None:
    view, warm, _ = cluster()
    home = choose("chwbl", view, warm).replica
    view.inflight[home] = 10  # m = 10 over 3 replicas, bound ceil(1.25 * 11 / 3) = 5
    d = choose("chwbl", view, warm)
    assert d.replica != home and d.reason.startswith("bounded-load-skip") and view.inflight[d.replica] < 5
    assert choose("oracle", view, warm).replica == 1


@pytest.mark.parametrize("name", ["round_robin", "random", "least_loaded", "session_affinity", "prefix_hash"])
def test_simple_policies_pick_active_replicas(name: str) -> None:
    view, warm, _ = cluster(4)
    view.set_active(np.array([0, 2, 3]))
    for _ in range(20):
        assert choose(name, view, warm).replica in (0, 2, 3)
