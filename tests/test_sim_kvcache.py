"""The compiled replica cache (vLLM semantics) against the brute-force reference, on random traces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.sim.kvcache import KVState
from tests.oracles.replica_ref import ReferenceReplica


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
    """Random interleaving of admits (some capped one block short, as vLLM caps a full hit), releases (some
    caching generated blocks) and restarts; the pool (`KVState`) and the reference pool agree throughout."""
    n_blocks = 1 + max(b for r in reqs for b in r)
    kv = KVState(1, n_blocks, capacity)
    ref = ReferenceReplica(capacity)
    running: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    waiting = list(enumerate(reqs))
    t = 0.0
    while waiting or running:
        t += 1.0
        if rng.random() < restart_p:
            assert kv.clear_free(0) == ref.clear_free()
        if waiting and (len(running) < max_running and rng.random() < 0.6 or not running):
            rid, path = waiting[0]
            cut = len(path) if rng.random() >= gen_p else int(rng.integers(1, len(path) + 1))
            blocks = np.array(path[:cut], dtype=np.int32)
            gen = np.array(path[cut:], dtype=np.int32)  # the chain continues with "generated" blocks
            total = min(len(blocks) + int(rng.integers(0, 3)) + len(gen) // 2, capacity - 1)  # + partial, decode
            blocks = blocks[:total]
            max_hit = len(blocks) - int(rng.random() < 0.3)  # an exact multiple of B: the last block recomputed
            assert kv.match(0, blocks) == ref.match(list(blocks))
            table = np.zeros(total, dtype=np.int32)
            before = ref.cached
            k, ne = kv.admit(0, blocks, max_hit, total, t, table)
            assert k == ref.admit(rid, list(blocks), max_hit, total)
            if k >= 0:
                assert set(kv.scratch[:ne].tolist()) == before - ref.cached
                waiting.pop(0)
                running.append((rid, blocks, gen, table))
            else:
                assert running, "a request that fits an empty replica must be admitted when nothing runs"
        elif running:
            rid, blocks, gen, table = running.pop(int(rng.integers(len(running))))
            if len(gen):
                assert kv.release_gen(0, table, len(blocks), gen, t) == ref.release_gen(rid, list(gen))
            else:
                kv.release(0, table, t)
                ref.release(rid)
        resident = set(np.flatnonzero(kv.res[0]).tolist())
        assert resident == ref.cached
        assert kv.available(0) == ref.available()
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


def blocks_of(*ids: int) -> np.ndarray:
    return np.array(ids, dtype=np.int32)


def test_reverse_order_release_evicts_tail_first() -> None:
    kv = KVState(1, 10, 5)  # 5 blocks, block 0 is the null block: 4 hold cache
    table = np.zeros(4, dtype=np.int32)
    kv.admit(0, blocks_of(0, 1, 2, 3), 4, 4, 0.0, table)
    kv.release(0, table, 1.0)
    k, ne = kv.admit(0, blocks_of(5), 1, 1, 2.0, np.zeros(1, dtype=np.int32))
    assert (k, ne) == (0, 1) and kv.scratch[0] == 3  # the chain's tail goes first
    assert kv.match(0, blocks_of(0, 1, 2, 3)) == 3  # the head stays hittable (lazy eviction)


def test_null_block_holds_nothing() -> None:
    kv = KVState(1, 10, 4)  # 4 blocks: 3 usable
    assert kv.available(0) == 3
    assert kv.admit(0, blocks_of(0, 1, 2, 3), 4, 4, 0.0, np.zeros(4, dtype=np.int32))[0] == -1


def test_pinned_blocks_are_never_evicted() -> None:
    kv = KVState(1, 10, 5)
    assert kv.admit(0, blocks_of(0, 1, 2), 3, 3, 0.0, np.zeros(3, dtype=np.int32)) == (0, 0)
    assert kv.admit(0, blocks_of(5, 6), 2, 2, 1.0, np.zeros(2, dtype=np.int32))[0] == -1  # one free slot
    assert kv.admit(0, blocks_of(0, 1, 7), 3, 3, 1.0, np.zeros(3, dtype=np.int32)) == (2, 0)  # shares the head


def test_capped_full_hit_keeps_a_second_copy() -> None:
    """A prompt of exactly k blocks seen before hits k - 1 (the last token is recomputed); the recomputed
    block is cached again in a new block: two copies, so the pool holds one block less of other data."""
    kv = KVState(1, 10, 4)  # 3 usable blocks
    first = np.zeros(2, dtype=np.int32)
    kv.admit(0, blocks_of(0, 1), 1, 2, 0.0, first)
    kv.release(0, first, 1.0)
    again = np.zeros(2, dtype=np.int32)
    assert kv.admit(0, blocks_of(0, 1), 1, 2, 2.0, again) == (1, 0)
    assert again[0] == first[0] and again[1] not in first  # block 1 is held twice now
    kv.release(0, again, 3.0)
    k, ne = kv.admit(0, blocks_of(5), 1, 1, 4.0, np.zeros(1, dtype=np.int32))
    assert ne == 0 and kv.match(0, blocks_of(0, 1)) == 2  # the old copy went first: block 1 still cached


def test_partial_block_occupies_only_while_running() -> None:
    kv = KVState(1, 10, 4)  # 3 usable
    t = np.zeros(3, dtype=np.int32)
    kv.admit(0, blocks_of(0, 1), 2, 3, 0.0, t)  # two full blocks and a partial one
    kv.release(0, t, 1.0)
    assert kv.available(0) == 3
    # the partial block went to the front of the free queue: the next new block reuses it, nothing evicted
    assert kv.admit(0, blocks_of(7), 1, 1, 2.0, np.zeros(1, dtype=np.int32)) == (0, 0)
    assert kv.match(0, blocks_of(0, 1)) == 2


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 40), min_size=0, max_size=3000))
def test_dense_ids_is_an_exact_relabelling(values: list[int]) -> None:
    from prefixscan.encode.dense import dense_ids

    x = np.array(values, dtype=np.uint64)
    ids, n = dense_ids(x)
    assert n == len(set(values))
    pairs = set(zip(values, ids.tolist(), strict=True))
    assert len(pairs) == n  # equal hash <=> equal id
    assert sorted({i for _, i in pairs}) == list(range(n))
