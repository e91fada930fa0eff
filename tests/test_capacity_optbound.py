"""OPT = ideal from the bound L on (`capacity.lru.opt_ideal_capacity`), checked against the simulated optimal cache."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.reuse.capacity.lru import opt_hits, opt_ideal_capacity, prepare
from tests.oracles.lru_stack import lru_curves
from tests.test_pool_fast import chained, scrambled


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.integers(1, 80), st.sampled_from(["vllm", "trace"]))
def test_opt_equals_ideal_from_the_bound_on(seed: int, tidy: bool, n: int, rule: str) -> None:
    rng = np.random.default_rng(seed)
    rows, prompts = chained(rng, n, 4, True) if tidy else scrambled(rng, n, 4)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    hashes = np.array([h for r in rows for h in r], np.uint64)
    prep = prepare(offsets, hashes, prompts, 4, rule)
    bound = opt_ideal_capacity(prep.offsets, prep.ids, prep.n_distinct)
    assert 0 <= bound <= prep.n_distinct
    ideal = int(lru_curves(prep)[0][-1])
    caps = list(range(bound, prep.n_distinct + 2))
    if caps:
        assert opt_hits(prep, caps)[0].tolist() == [ideal] * len(caps)


def test_the_bound_is_the_largest_overlap_of_lifetimes() -> None:
    def bound(rows: list[list[int]]) -> int:
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        hashes = np.array([h for r in rows for h in r], np.uint64)
        prep = prepare(offsets, hashes, np.array([4 * len(r) for r in rows]), 4, "trace")
        return opt_ideal_capacity(prep.offsets, prep.ids, prep.n_distinct)

    assert bound([[1, 2], [1, 2, 3], [1, 4], [5]]) == 3  # request 1 holds 1, 2, 3 alive at once
    # not chained (block 3, used again, follows block 1, never used again): no shortcut, the working set
    assert bound([[1, 2], [1, 3, 4], [2, 3], [5]]) == 5
    assert opt_ideal_capacity(np.zeros(1, np.int64), np.zeros(0, np.int32), 0) == 0
