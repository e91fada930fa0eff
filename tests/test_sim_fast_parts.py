"""Pieces of the compiled replay checked on their own: routing-key hashes, the event heap, reason codes."""

from __future__ import annotations

import heapq

import numpy as np
import pyarrow as pa
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.sim.fast import _reasons, _sources, fingerprint
from prefixscan.sim.fast.kernel import heap_pop, heap_push
from prefixscan.sim.fast.shared import request_keys, xxh3_u64_vec
from prefixscan.sim.policies.base import Req, request_key
from prefixscan.sim.workload import build_workload
from tests.sim_tables import conversations_table


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20), st.integers(0, 2**64 - 1))
def test_xxh3_of_one_integer_matches_the_xxhash_package(values: list[int], seed: int) -> None:
    arr = np.array(values, dtype=np.uint64)
    got = xxh3_u64_vec(arr, np.uint64(seed), np.zeros(len(arr), dtype=np.uint64))
    want = [xxhash.xxh3_64_intdigest(v.to_bytes(8, "little"), seed=seed) for v in values]
    assert got.tolist() == want


def test_request_keys_match_the_reference_key_per_request() -> None:
    t = conversations_table(30, 3, seed=4)
    conv = t["conversation_id"].to_pylist()
    some = pa.array([c if k % 3 else None for k, c in enumerate(conv)])  # a third without a conversation
    t = t.set_column(t.schema.get_field_index("conversation_id"), "conversation_id", some)
    w = build_workload(t, 16)
    for mode, pb in (("conversation", 4), ("prefix", 2), ("prefix", 50)):
        keys = request_keys(w, mode, pb)
        for i in range(w.n):
            blocks = w.blocks[w.offsets[i] : w.offsets[i + 1]]
            req = Req(i, blocks, int(w.prompt_tokens[i]), 1, -1, int(w.conv_key[i]), 0.0)
            assert int(keys[i]) == request_key(req, mode, pb, w.block_keys)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1)), min_size=1, max_size=60))
def test_heap_pops_in_heapq_order(events: list[tuple[int, int]]) -> None:
    ht, hm = np.zeros(len(events)), np.zeros((len(events), 3), dtype=np.int64)
    ref: list[tuple[float, int, int, int, int]] = []
    size = 0
    for c, (t, kind) in enumerate(events):
        size = heap_push(ht, hm, size, float(t) / 2, kind, c, c % 7, c)
        heapq.heappush(ref, (float(t) / 2, kind, c, c % 7, c))
    while size:
        t, kind, r, i, size = heap_pop(ht, hm, size)
        want = heapq.heappop(ref)
        assert (t, kind, r, i) == (want[0], want[1], want[3], want[4])


def test_reason_codes_are_renumbered_by_first_appearance() -> None:
    codes, names = _reasons(np.array([3, 3, 0, 5, 0, 3]), lambda c: f"r{c}")
    assert names == ["r3", "r0", "r5"] and codes.tolist() == [0, 0, 1, 2, 1, 0] and codes.dtype == np.int16
    empty, none = _reasons(np.zeros(0, dtype=np.int64), str)
    assert none == [] and len(empty) == 0


def test_cache_fingerprint_covers_the_kernels_and_their_dependencies() -> None:
    """Every file a kernel is compiled from, the policies' included (each holds its kernel, which the
    event loop calls: they once were left out, so editing a policy left the loop's cached code stale)."""
    fp = fingerprint()
    assert len(fp) == 40 and fp == fingerprint()
    names = {p.name for p in _sources()}
    assert {"kernel.py", "shared.py", "layout.py", "views.py", "kvcache.py", "chwbl.py", "cost_based.py",
            "timing.py", "hitrule.py"} <= names  # timing: the prefill formula; hitrule: block_tokens
    from prefixscan.sim.fast import _dispatchers
    from prefixscan.sim.policies import chwbl

    assert chwbl.kernel in _dispatchers()
