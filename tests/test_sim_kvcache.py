"""The compiled replica cache (vLLM semantics) against the brute-force reference, on random traces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.sim.kvcache import KVState
from prefixscan.sim.reference import ReferenceReplica


def random_chains(
    rng: np.random.Generator, n_requests: int, branching: int = 3, depth: int = 12
) -> list[list[int]]:
    """Requests as paths in a random prefix tree; node ids are dense so they act as block ids."""
    children: dict[tuple[int, int], int] = {}
    reqs = []
    for _ in range(n_requests):
        path, parent = [], -1
        for _ in range(int(rng.integers(1, depth + 1))):
            key = (parent, int(rng.integers(branching)))
            if key not in children:
                children[key] = len(children)
            parent = children[key]
            path.append(parent)
        reqs.append(path)
    return reqs


def run_both(
    reqs: list[list[int]],
    capacity: int,
    rng: np.random.Generator,
    max_running: int = 4,
    restart_p: float = 0.0,
    gen_p: float = 0.0,
) -> None:
    """Random interleaving of admits, releases (some caching generated blocks) and restarts."""
    n_blocks = 1 + max(b for r in reqs for b in r)
    kv = KVState(1, n_blocks, capacity)
    ref = ReferenceReplica(capacity)
    running: list[tuple[np.ndarray, np.ndarray, int]] = []
    waiting = list(reqs)
    t = 0.0
    while waiting or running:
        t += 1.0
        if rng.random() < restart_p:
            assert kv.clear_free(0) == ref.clear_free()
        if waiting and (len(running) < max_running and rng.random() < 0.6 or not running):
            path = waiting[0]
            cut = len(path) if rng.random() >= gen_p else int(rng.integers(1, len(path) + 1))
            blocks = np.array(path[:cut], dtype=np.int32)
            gen = np.array(path[cut:], dtype=np.int32)  # the chain continues with "generated" blocks
            extra = int(rng.integers(0, 3)) + len(gen) // 2
            assert kv.match(0, blocks) == ref.match(list(blocks))
            k, ne = kv.admit(0, blocks, extra, t)
            k_ref = ref.admit(list(blocks), extra)
            assert k == k_ref
            if k >= 0:
                assert sorted(kv.scratch[:ne].tolist()) == sorted(ref.evicted[-ne:] if ne else [])
                waiting.pop(0)
                running.append((blocks, gen, extra))
            else:
                assert running, "a request that fits an empty replica must be admitted when nothing runs"
        elif running:
            blocks, gen, extra = running.pop(int(rng.integers(len(running))))
            if len(gen):
                assert kv.release_gen(0, blocks, gen, extra, t) == ref.release_gen(
                    list(blocks), list(gen), extra
                )
            else:
                kv.release(0, blocks, extra, t)
                ref.release(list(blocks), extra)
        resident = set(np.flatnonzero(kv.res[0]).tolist())
        assert resident == ref.cached
        assert kv.meta[0, 2] == ref.used()
        assert int(kv.evictions[0]) == len(ref.evicted)
        # prefix closure: every resident block's chain prefix is resident (so binary search is exact)
        for r in reqs:
            present = [b in resident for b in r]
            assert present == sorted(present, reverse=True)


@pytest.mark.parametrize("seed", range(12))
def test_matches_reference_random_traces(seed: int) -> None:
    rng = np.random.default_rng(seed)
    reqs = random_chains(rng, 60)
    capacity = int(rng.integers(14, 60))
    restart_p = 0.03 if seed % 3 == 0 else 0.0
    run_both(
        reqs, capacity, rng, max_running=int(rng.integers(1, 5)), restart_p=restart_p, gen_p=0.5 * (seed % 2)
    )


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), capacity=st.integers(14, 80), branching=st.integers(1, 4))
def test_matches_reference_hypothesis(seed: int, capacity: int, branching: int) -> None:
    rng = np.random.default_rng(seed)
    run_both(random_chains(rng, 40, branching=branching), capacity, rng, gen_p=0.5)


def test_reverse_order_release_evicts_tail_first() -> None:
    kv = KVState(1, 10, 4)
    kv.admit(0, np.array([0, 1, 2, 3], dtype=np.int32), 0, 0.0)
    kv.release(0, np.array([0, 1, 2, 3], dtype=np.int32), 0, 1.0)
    k, ne = kv.admit(0, np.array([5], dtype=np.int32), 0, 2.0)
    assert (k, ne) == (0, 1) and kv.scratch[0] == 3  # the chain's tail goes first
    assert kv.match(0, np.array([0, 1, 2, 3], dtype=np.int32)) == 3  # the head stays hittable (lazy eviction)


def test_pinned_blocks_are_never_evicted() -> None:
    kv = KVState(1, 10, 4)
    assert kv.admit(0, np.array([0, 1, 2], dtype=np.int32), 0, 0.0) == (0, 0)
    assert kv.admit(0, np.array([5, 6], dtype=np.int32), 0, 1.0)[0] == -1  # only one free slot
    assert kv.admit(0, np.array([0, 1, 7], dtype=np.int32), 0, 1.0) == (2, 0)  # shares the pinned head


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 40), min_size=0, max_size=3000))
def test_dense_ids_is_an_exact_relabelling(values: list[int]) -> None:
    from prefixscan.dense import dense_ids

    x = np.array(values, dtype=np.uint64)
    ids, n = dense_ids(x)
    assert n == len(set(values))
    pairs = set(zip(values, ids.tolist(), strict=True))
    assert len(pairs) == n  # equal hash <=> equal id
    assert sorted({i for _, i in pairs}) == list(range(n))
