"""Hash tables sized ahead from a sample, and the ideal scopes run in threads: neither changes a result.

A DenseTable or SeenSet about to take a chunk grows once to an estimate of what the chunk adds
(`dense._room`); growth in steps stays as the fallback when the estimate falls short. `IdealStream.add`
runs its three scopes in threads on large chunks. Each is checked against plain Python references here,
and against the brute-force oracle in chunks, with threads forced on and off.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.encode import dense
from prefixscan.encode.dense import MAX_LOAD, DenseTable, SeenSet
from prefixscan.reuse import ideal as ideal_mod
from prefixscan.reuse.ideal import IdealStream, scope_salts
from tests.oracles.ideal_ref import ideal_reuse_ref
from tests.test_ideal import B, chain_ids

SALTS = [0, 1, 7, 2**63, 0x9E3779B97F4A7C15]


def _mixed(h: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser `dense._slot` and `dense._sample` apply to a key."""
    z = h ^ (h >> np.uint64(33))
    z = z * np.uint64(0xFF51AFD7ED558CCD)
    return z ^ (z >> np.uint64(33))


chunks = st.lists(st.lists(st.lists(st.integers(0, 40), max_size=30), max_size=12), min_size=1, max_size=5)


@settings(max_examples=120, deadline=None)
@given(chunks, st.lists(st.integers(0, len(SALTS) - 1), min_size=60, max_size=60), st.integers(16, 300))
def test_tables_fed_chunks_equal_a_dict_and_a_set(parts: list, salt_pick: list, slots: int) -> None:
    """Ids in first-appearance order and leading runs of seen keys, key 0 and salts included, whatever the
    starting size; after every chunk the table holds its keys under the load limit."""
    table, seen = DenseTable(slots=slots), SeenSet(slots=slots)
    ref_ids: dict[int, int] = {}
    ref_seen: set[int] = set()
    row = 0
    for rows in parts:
        off = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        flat = np.array([h for r in rows for h in r], dtype=np.uint64)
        salts = np.array([SALTS[salt_pick[(row + i) % 60]] for i in range(len(rows))], dtype=np.uint64)
        row += len(rows)
        valid = salts != 7  # rows salted 7 stay out of the set
        ids = table.ids(flat, off, salts)
        runs = seen.runs(off, flat, salts, valid)
        keys = [[h ^ int(s) for h in r] for r, s in zip(rows, salts.tolist(), strict=True)]
        want_ids = [ref_ids.setdefault(k, len(ref_ids)) for r in keys for k in r]
        assert ids.tolist() == want_ids
        for i, r in enumerate(keys):
            k = 0
            if valid[i]:
                while k < len(r) and r[k] in ref_seen:
                    k += 1
                ref_seen.update(r)
            assert runs[i] == k
        assert table.n == len(ref_ids) <= len(table.keys) * MAX_LOAD
        assert seen.n == len(ref_seen - {0}) <= len(seen.keys) * MAX_LOAD


def _unsampled(n: int, start: int) -> np.ndarray:
    """n distinct keys the sample never picks: the estimate of their number is 0."""
    cand = np.arange(start, start + 4 * n + 1000, dtype=np.uint64)
    mask = np.uint64((1 << dense.SAMPLE_BITS) - 1)
    return cand[(_mixed(cand) & mask) != 0][:n]


def test_an_estimate_that_falls_short_still_grows_in_steps() -> None:
    """Keys the sample misses make the estimate too small: the tables grow on the way and stay exact."""
    keys = _unsampled(20000, 1)
    off = np.array([0, len(keys)], dtype=np.int64)
    table = DenseTable(slots=16)
    assert np.array_equal(table.ids(keys), np.arange(len(keys)))
    assert table.n == len(keys) <= len(table.keys) * MAX_LOAD
    seen = SeenSet(slots=16)
    one = np.zeros(1, np.uint64)
    assert seen.runs(off, keys, one, np.ones(1, np.bool_)).tolist() == [0]
    assert seen.n == len(keys) <= len(seen.keys) * MAX_LOAD
    assert seen.runs(off, keys, one, np.ones(1, np.bool_)).tolist() == [len(keys)]


def test_tables_are_sized_by_distinct_keys_not_blocks() -> None:
    """A chunk of 400k blocks over 10k distinct keys leaves tables sized for about 10k keys: memory follows
    the distinct blocks, as a streamed log promises."""
    rng = np.random.default_rng(5)
    distinct = rng.integers(1, 2**63, 10000, dtype=np.uint64)
    flat = distinct[rng.integers(0, len(distinct), 400000)]
    table = DenseTable(slots=16)
    table.ids(flat)
    assert len(table.keys) <= 1.5 * table.n / MAX_LOAD
    seen = SeenSet(slots=16)
    off = np.arange(0, len(flat) + 1, 100, dtype=np.int64)
    seen.runs(off, flat, np.zeros(len(off) - 1, np.uint64), np.ones(len(off) - 1, np.bool_))
    assert len(seen.keys) <= 1.5 * seen.n / MAX_LOAD


def test_a_table_with_room_is_not_resized() -> None:
    table = DenseTable()
    before = table.keys
    table.ids(np.arange(1, 1000, dtype=np.uint64))
    assert table.keys is before


@st.composite
def traces(draw):
    """Requests sharing prefixes, with tenants and conversations, and where the log is cut into chunks."""
    reqs = []
    for _ in range(draw(st.integers(1, 30))):
        if reqs and draw(st.booleans()):
            base = draw(st.sampled_from(reqs))[0]
            toks = base[:draw(st.integers(0, len(base)))] + draw(st.lists(st.integers(0, 3), max_size=12))
        else:
            toks = draw(st.lists(st.integers(0, 3), min_size=1, max_size=20))
        reqs.append((toks or [0], draw(st.sampled_from(["a", "b", None])),
                     draw(st.sampled_from(["c1", "c2", None]))))
    return reqs, draw(st.lists(st.integers(0, 30), max_size=4))


@settings(max_examples=100, deadline=None)
@given(traces(), st.booleans())
def test_stream_in_chunks_with_threads_equals_bruteforce(trace, threads: bool) -> None:
    """Scopes in threads (forced even on tiny chunks) or not, in any chunks: the brute-force results."""
    reqs, cuts = trace
    blocks = [chain_ids([hash(tuple(t[:(j + 1) * B])) & 0xFFFFFFFF for j in range(-(-len(t) // B))], 77)
              for t, _, _ in reqs]
    prompt = np.array([len(t) for t, _, _ in reqs], dtype=np.int64)
    off = np.concatenate([[0], np.cumsum([len(b) for b in blocks])]).astype(np.int64)
    flat = np.concatenate(blocks)
    ten, conv = scope_salts([r[1] for r in reqs]), scope_salts([r[2] for r in reqs])
    n = len(reqs)
    edges = sorted({0, n, *[c for c in cuts if c <= n]})
    stream, got = IdealStream(), []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ideal_mod, "PARALLEL_BLOCKS", 0 if threads else 2**62)
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            got.append(stream.add(off[a:b + 1] - off[a], flat[off[a]:off[b]], prompt[a:b], B, "trace",
                                  ten[a:b], conv[a:b])[0])
    ref = ideal_reuse_ref([b.tolist() for b in blocks], prompt.tolist(), B, "trace", [r[1] for r in reqs],
                          [r[2] for r in reqs])
    for field, key in (("cached_blocks", "k"), ("cached_tokens", "tokens"), ("source", "source"),
                       ("tenant_cached_tokens", "tenant_tokens"), ("conversation_cached_tokens", "conv_tokens")):
        assert np.concatenate([getattr(g, field) for g in got]).tolist() == ref[key], field


def test_concurrently_keeps_order_and_raises_a_thread_error() -> None:
    def boom() -> None:
        raise OverflowError("from a thread")

    assert ideal_mod._concurrently(lambda: 1, None, lambda: 3, parallel=True) == [1, None, 3]
    assert ideal_mod._concurrently(None, lambda: 2, parallel=False) == [None, 2]
    with pytest.raises(OverflowError, match="from a thread"):
        ideal_mod._concurrently(lambda: 1, boom, parallel=True)


def test_a_chunk_whose_keys_are_all_sampled_is_estimated_in_full() -> None:
    """A crafted chunk of keys the sample all picks overflows the sample's buffer: it is taken again in
    full, and the table grows once to hold them all."""
    cand = np.arange(1, 2_000_000, dtype=np.uint64)
    keys = cand[(_mixed(cand) & np.uint64((1 << dense.SAMPLE_BITS) - 1)) == 0][:5000]
    assert len(keys) == 5000
    table = DenseTable(slots=16)
    grown: list[int] = []
    grow = table._grow
    table._grow = lambda cap: (grown.append(cap), grow(cap))  # type: ignore[method-assign]
    assert np.array_equal(table.ids(keys), np.arange(len(keys)))
    assert len(grown) == 1 and table.n <= len(table.keys) * MAX_LOAD


def test_scopes_run_in_threads_only_on_a_large_chunk_with_cores_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads for a chunk of PARALLEL_BLOCKS blocks or more when the process may use two cores or more;
    one thread otherwise (held to one core, threads would only take turns)."""
    seen: list[bool] = []
    run = ideal_mod._concurrently

    def spy(*calls, parallel: bool) -> list:
        seen.append(parallel)
        return run(*calls, parallel=parallel)

    monkeypatch.setattr(ideal_mod, "_concurrently", spy)
    monkeypatch.setattr(ideal_mod, "PARALLEL_BLOCKS", 8)
    off, ten = np.array([0, 4, 8], dtype=np.int64), scope_salts(["a", "b"])
    for cores, blocks, want in ((2, 8, True), (1, 8, False), (2, 4, False)):
        monkeypatch.setattr(ideal_mod, "_cores", lambda c=cores: c)
        flat = np.arange(1, blocks + 1, dtype=np.uint64)
        o = off if blocks == 8 else np.array([0, 2, 4], dtype=np.int64)
        IdealStream().add(o, flat, np.array([64, 64]), B, "trace", ten, ten)
        assert seen[-1] is want


def test_tables_grow_one_after_another_before_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The three tables grow in the calling thread, one at a time, before the scopes run in threads: at
    most one table has its old and new arrays alive at once, as without threads."""
    import threading

    grown: list[tuple[str, bool]] = []
    for cls in (DenseTable, SeenSet):
        def spy(self, cap: int, grow=cls._grow, name=cls.__name__) -> None:  # type: ignore[no-untyped-def]
            grown.append((name, threading.current_thread() is threading.main_thread()))
            grow(self, cap)
        monkeypatch.setattr(cls, "_grow", spy)
    monkeypatch.setattr(ideal_mod, "PARALLEL_BLOCKS", 0)
    monkeypatch.setattr(ideal_mod, "_cores", lambda: 2)
    rng = np.random.default_rng(3)
    stream = IdealStream()
    for _ in range(3):
        lengths = rng.integers(1, 400, 300)
        off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = rng.integers(1, 2**40, int(off[-1]), dtype=np.uint64)
        salts = scope_salts([f"s{i}" for i in rng.integers(0, 5, 300)])
        stream.add(off, flat, lengths * 16, 16, "vllm", salts, salts)
    assert {name for name, _ in grown} == {"DenseTable", "SeenSet"}
    assert all(main for _, main in grown)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=200), st.lists(st.lists(st.integers(0, 80), max_size=8), max_size=10),
       st.integers(16, 100))
def test_a_set_made_of_a_table_holds_its_keys(first: list, rows: list, slots: int) -> None:
    """SeenSet.of_table (the tenant scope starting as the whole log) then runs: as a Python set of the
    table's keys would give, key 0 included, whatever the table's size."""
    table = DenseTable(slots=slots)
    table.ids(np.array(first, dtype=np.uint64))
    seen = SeenSet.of_table(table)
    assert seen.n == len(set(first) - {0}) <= len(seen.keys) * MAX_LOAD
    ref = set(first)
    off = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    flat = np.array([h for r in rows for h in r], dtype=np.uint64)
    got = seen.runs(off, flat, np.zeros(len(rows), np.uint64), np.ones(len(rows), np.bool_))
    for i, r in enumerate(rows):
        k = 0
        while k < len(r) and r[k] in ref:
            k += 1
        ref.update(r)
        assert got[i] == k


def test_many_small_chunks_grow_a_table_a_logarithmic_number_of_times() -> None:
    """A log streamed in 300 chunks of 500 new keys each: the tables grow geometrically, not once a chunk
    (each grow rehashes every key held, so once a chunk would be quadratic in the log)."""
    table, seen = DenseTable(slots=16), SeenSet(slots=16)
    grows = {"table": 0, "set": 0}
    grow_t, grow_s = table._grow, seen._grow

    def count_t(cap: int) -> None:
        grows["table"] += 1
        grow_t(cap)

    def count_s(cap: int) -> None:
        grows["set"] += 1
        grow_s(cap)

    table._grow, seen._grow = count_t, count_s  # type: ignore[method-assign]
    off = np.array([0, 500], dtype=np.int64)
    for c in range(300):
        keys = np.arange(1 + 500 * c, 1 + 500 * (c + 1), dtype=np.uint64)
        table.ids(keys)
        seen.runs(off, keys, np.zeros(1, np.uint64), np.ones(1, np.bool_))
    assert table.n == seen.n == 150000
    assert grows["table"] <= 40 and grows["set"] <= 40, grows
