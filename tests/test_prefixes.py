"""The top-prefixes table: ranking on the cheap sum first must not change any row of the top k."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.reuse.prefixes import prefixes_table


def _requests(rows: list[tuple[int, int, int]]) -> tuple[pl.DataFrame, np.ndarray]:
    """(deepest prefix id, cached tokens, tenant) per request, in arrival order."""
    n = len(rows)
    req = pl.DataFrame({
        "seq": np.arange(n, dtype=np.int64),
        "tenant": [f"t{t}" for _, _, t in rows],
        "arrival_s": np.arange(n, dtype=np.float64) * 1.5,
        "cached_tokens": np.array([c for _, c, _ in rows], dtype=np.int64),
        "tenant_cached_tokens": np.array([c if t == 0 else 0 for _, c, t in rows], dtype=np.int64),
        "cached_blocks": np.array([1 if c else 0 for _, c, _ in rows], dtype=np.int32),
        "request_id": [f"r{i}" for i in range(n)],
        "_source": np.where(np.array([c for _, c, _ in rows]) > 0, 0, -1).astype(np.int64),
    })
    deepest = np.array([p for p, _, _ in rows], dtype=np.uint64)
    return req, deepest


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.sampled_from([0, 16, 32, 48]), st.integers(0, 2)),
                min_size=1, max_size=80), st.integers(1, 6))
def test_top_k_rows_equal_the_head_of_the_whole_table(rows, k) -> None:
    req, deepest = _requests(rows)
    snippets = [f"text {i}" for i in range(len(rows))]
    whole = prefixes_table(req, deepest, snippets, top=10_000)
    top = prefixes_table(req, deepest, snippets, top=k)
    assert top.equals(whole.head(k))
    assert whole["tokens_saved"].to_list() == sorted(whole["tokens_saved"].to_list(), reverse=True)


def test_hits_and_gaps_of_one_prefix() -> None:
    req, deepest = _requests([(7, 32, 0), (7, 32, 1), (9, 0, 0), (7, 16, 0)])
    t = prefixes_table(req, deepest, [], top=5).to_dicts()
    assert len(t) == 1
    row = t[0]
    assert (row["hits"], row["tokens_saved"], row["tenants"], row["cross_tenant_hits"]) == (3, 80, 2, 1)
    assert row["median_reuse_gap_s"] == 2.25 and row["snippet"] == ""
