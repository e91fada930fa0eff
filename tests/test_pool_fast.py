"""The block pool at every size from one LRU pass (`pool_fast`) equals the pool simulated size by size."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.reuse.capacity.lru import prepare
from prefixscan.reuse.pool import pool_curve
from prefixscan.reuse.pool_fast import lru_pool_curves, merged
from tests.oracles.lru_stack import lru_curves


def chained(rng: np.random.Generator, n: int, block: int, partial: bool) -> tuple:
    """Conversations that grow and share system prompts: chained ids, as real block hashes are."""
    rows, convs, nxt = [], [], 1000
    systems = [list(range(s * 50, s * 50 + int(rng.integers(1, 5)))) for s in range(4)]
    for _ in range(n):
        if convs and rng.random() < 0.6:
            c = convs[int(rng.integers(len(convs)))]
            c += list(range(nxt, nxt + int(rng.integers(0, 3))))
        else:
            c = list(systems[int(rng.integers(len(systems)))]) + list(range(nxt, nxt + int(rng.integers(0, 4))))
            convs.append(c)
        nxt += 4
        rows.append(list(c))
    extra = rng.integers(0, block, n) if partial else rng.integers(-1, 2, n) * (block // 2)
    prompts = np.array([max(0, len(r) * block + int(e)) for r, e in zip(rows, extra, strict=True)], np.int64)
    return rows, prompts


def scrambled(rng: np.random.Generator, n: int, block: int) -> tuple:
    """Any ids at all: repeats inside a request, gaps in chains, prompts shorter or longer than the listing."""
    rows = [list(rng.integers(0, 12, int(rng.integers(0, 6)))) for _ in range(n)]
    prompts = np.array([int(rng.integers(0, (len(r) + 3) * block)) for r in rows], np.int64)
    return rows, prompts


def check(rows: list[list[int]], prompts: np.ndarray, block: int, rule: str) -> int:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    hashes = np.array([h for r in rows for h in r], np.uint64)
    prep = prepare(offsets, hashes, prompts, block, rule)
    keyed, fast = lru_pool_curves(prep.offsets, prep.ids, prep.weights, prep.n_distinct, prompts, block, rule)
    assert np.array_equal(keyed, lru_curves(prep)[0])

    def simulate(sizes):
        return pool_curve(prep.offsets, prep.ids, prep.n_distinct, prompts, block, rule, sizes)[0]

    sizes = list(range(0, prep.n_distinct + 40))
    assert merged(fast, simulate, sizes).tolist() == list(simulate(sizes))
    return sum(fast.covers(s) for s in sizes)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["vllm", "trace"]), st.booleans(), st.integers(1, 60))
def test_fast_pool_equals_the_simulated_pool(seed: int, rule: str, tidy: bool, n: int) -> None:
    rng = np.random.default_rng(seed)
    block = int(rng.choice([1, 2, 4, 16]))
    rows, prompts = chained(rng, n, block, bool(rng.random() < 0.5)) if tidy else scrambled(rng, n, block)
    check(rows, prompts, block, rule)


def test_chained_traces_are_mostly_fast() -> None:
    """Not vacuous: on chained hashes the histogram serves every size above the largest request."""
    rng = np.random.default_rng(3)
    rows, prompts = chained(rng, 400, 16, False)
    prompts = np.array([len(r) * 16 for r in rows], np.int64)  # whole blocks: trace rule, nothing unlisted
    covered = check(rows, prompts, 16, "trace")
    assert covered >= len(set(h for r in rows for h in r)) + 40 - max(len(r) for r in rows) - 1
    rows, _ = chained(rng, 400, 16, True)
    prompts = np.array([len(r) * 16 + int(rng.integers(1, 16)) for r in rows], np.int64)  # a partial last block
    assert check(rows, prompts, 16, "vllm") >= len(set(h for r in rows for h in r)) + 40 - max(len(r) for r in rows) - 2


def test_empty_input() -> None:
    keyed, fast = lru_pool_curves(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64), 0,
                                  np.zeros(0, np.int64), 16, "vllm")
    assert keyed.tolist() == [0] and fast.lo == 1
