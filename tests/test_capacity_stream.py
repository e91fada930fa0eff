"""CapacityStream: the capacity table from requests fed in chunks equals `capacity_curve` on the whole log."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.encode.dense import dense_ids
from prefixscan.reuse.capacity import stream
from prefixscan.reuse.capacity.lru import capacity_curve
from prefixscan.reuse.capacity.stream import CapacityStream

Log = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # offsets, dense ids, prompt tokens, distinct


def log_of(requests: list[list[int]], prompts: list[int]) -> Log:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in requests])]).astype(np.int64)
    ids, n = dense_ids(np.array([b for r in requests for b in r], dtype=np.uint64))
    return offsets, ids, np.array(prompts, dtype=np.int64), n


@st.composite
def logs(draw: st.DrawFn, block_size: int) -> Log:
    """Chained requests (a random earlier request's prefix, then new blocks) mixed with arbitrary ones
    (repeated ids within a request, ids at other positions) and requests with no blocks."""
    requests: list[list[int]] = []
    fresh = 1000
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["chain", "chain", "arbitrary", "empty"]))
        if kind == "chain":
            prev = requests[draw(st.integers(0, len(requests) - 1))] if requests else []
            n_new = draw(st.integers(0, 4))
            req = prev[: draw(st.integers(0, len(prev)))] + list(range(fresh, fresh + n_new))
            fresh += n_new
        elif kind == "arbitrary":
            req = draw(st.lists(st.integers(0, 6), max_size=6))
        else:
            req = []
        requests.append(req[:12])
    prompts = [draw(st.integers(0, (len(r) + 1) * block_size)) for r in requests]
    return log_of(requests, prompts)


def feed(cs: CapacityStream, log: Log, cuts: list[int]) -> None:
    """Feed the log cut at the given request indices (repeated cuts give empty chunks)."""
    offsets, ids, prompts, _ = log
    bounds = [0, *sorted(min(c, len(prompts)) for c in cuts), len(prompts)]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        cs.add(offsets[a : b + 1] - offsets[a], ids[offsets[a] : offsets[b]], prompts[a:b])


def assert_same(got: pa.Table, want: pa.Table) -> None:
    assert got.equals(want, check_metadata=True)
    assert got.schema.metadata == want.schema.metadata


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_stream_equals_capacity_curve(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    block_size = data.draw(st.integers(1, 4))
    rule = data.draw(st.sampled_from(["vllm", "trace"]))
    log = data.draw(logs(block_size))
    offsets, ids, prompts, n = log
    caps = data.draw(st.one_of(st.none(), st.lists(st.integers(0, (n + 3) * block_size), max_size=6)))
    opt = data.draw(st.booleans())
    cuts = data.draw(st.lists(st.integers(0, len(prompts)), max_size=6))
    want = capacity_curve(offsets, ids, prompts, block_size, rule, caps, opt, ids=(ids, n))
    # small tree floors and reads force the LRU renumbering and many spill chunks
    with CapacityStream(block_size, rule, str(tmp_path_factory.mktemp("spill")),
                        tree_floor=data.draw(st.integers(1, 8)), chunk_blocks=data.draw(st.integers(1, 40)),
                        defer_lru=data.draw(st.booleans())) as cs:
        feed(cs, log, cuts)
        got = cs.finish(n, caps, opt)
    assert_same(got, want)


def long_log(n_req: int, seed: int) -> Log:
    """Conversations that grow turn by turn on a few system prompts, with repeats; long enough that the
    LRU tree is renumbered and the OPT heaps compacted many times."""
    rng = np.random.default_rng(seed)
    requests: list[list[int]] = []
    fresh = 10_000
    for _ in range(n_req):
        if requests and rng.random() < 0.7:
            prev = requests[int(rng.integers(max(0, len(requests) - 40), len(requests)))]
            req = prev[: int(rng.integers(0, len(prev) + 1))] + [fresh, fresh + 1]
            fresh += 2
        else:
            req = [int(rng.integers(0, 3)), fresh]
            fresh += 1
        requests.append(req[:20])
    return log_of(requests, [4 * len(r) - int(rng.integers(0, 4)) for r in requests])


@pytest.mark.parametrize("rule", ["trace", "vllm"])
def test_renumbering_and_heap_compaction_keep_the_table(rule: str, tmp_path: Path) -> None:
    log = long_log(1500, seed=1)
    offsets, ids, prompts, n = log
    caps = [0, 4, 8, 12, 20, 52, 100, 400, 4 * n, 4 * n + 4]
    want = capacity_curve(offsets, ids, prompts, 4, rule, caps, ids=(ids, n))
    cs = CapacityStream(4, rule, str(tmp_path), tree_floor=16, chunk_blocks=97, opt_budget_bytes=0)
    feed(cs, log, [1, 1, 2, 200, 201, 900])
    assert cs._lru_state[1] < len(ids)  # the clock was reset: the tree was renumbered
    assert_same(cs.finish(n, caps), want)
    assert_same(_stream_default(log, rule, tmp_path), capacity_curve(offsets, ids, prompts, 4, rule, ids=(ids, n)))


def test_int64_keys_keep_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log whose next-use keys pass int32 spills and runs them as int64 (`lru.key_dtype`): the same table
    (forced here: such a log is too large for a test)."""
    log = long_log(600, seed=2)
    offsets, ids, prompts, n = log
    caps = [0, 4, 8, 20, 52, 100, 400]
    want = capacity_curve(offsets, ids, prompts, 4, "vllm", caps, ids=(ids, n))
    monkeypatch.setattr(stream, "key_dtype", lambda never: np.int64)
    cs = CapacityStream(4, "vllm", str(tmp_path), chunk_blocks=97)
    feed(cs, log, [100, 300])
    assert_same(cs.finish(n, caps), want)


def _stream_default(log: Log, rule: str, spill: Path) -> pa.Table:
    with CapacityStream(4, rule, str(spill), tree_floor=1, chunk_blocks=500) as cs:
        feed(cs, log, list(range(0, len(log[2]), 37)))
        return cs.finish(log[3])


def test_empty_stream(tmp_path: Path) -> None:
    want = capacity_curve(np.zeros(1, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64), 16, "vllm")
    with CapacityStream(16, "vllm", str(tmp_path)) as cs:
        assert_same(cs.finish(0), want)
    with CapacityStream(16, "vllm", str(tmp_path)) as cs:
        cs.add(np.array([0, 0]), np.zeros(0, np.int32), np.array([5]))
        assert_same(cs.finish(0, [0, 32]), capacity_curve(np.array([0, 0]), np.zeros(0, np.uint64), np.array([5]),
                                                          16, "vllm", [0, 32], ids=(np.zeros(0, np.int32), 0)))


def test_spill_files_are_removed(tmp_path: Path) -> None:
    log = long_log(50, seed=2)
    cs = CapacityStream(4, "trace", str(tmp_path))
    feed(cs, log, [10, 20])
    assert len(os.listdir(tmp_path)) == 2  # ids and prompt tokens
    cs.finish(log[3], [8, 40])
    assert os.listdir(tmp_path) == []
    cs.close()  # idempotent
    with pytest.raises(RuntimeError):
        cs.finish(log[3])
    with pytest.raises(RuntimeError):
        cs.add(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64))

    cs = CapacityStream(4, "trace", str(tmp_path))
    feed(cs, log, [25])
    cs.close()
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="n_distinct"), CapacityStream(4, "trace", str(tmp_path)) as cs:
        feed(cs, log, [])
        cs.finish(log[3] - 1)  # an error in finish removes the spills too
    assert os.listdir(tmp_path) == []


def test_bad_input_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rule"):
        CapacityStream(4, "sglang", str(tmp_path))
    with pytest.raises(ValueError, match="block_size"):
        CapacityStream(0, "vllm", str(tmp_path))
    with CapacityStream(4, "vllm", str(tmp_path)) as cs:
        ids = np.array([0, 1, 2], np.int32)
        with pytest.raises(ValueError, match="offsets end at 2 but the chunk has 3 block ids"):
            cs.add(np.array([0, 2]), ids, np.array([8]))
        with pytest.raises(ValueError, match="offsets must be non-decreasing"):
            cs.add(np.array([0, -1, 3]), ids, np.array([8, 8]))
        with pytest.raises(ValueError, match="offsets must be non-decreasing"):
            cs.add(np.array([1, 3]), ids[:2], np.array([8]))
        with pytest.raises(ValueError, match="prompt lengths"):
            cs.add(np.array([0, 3]), ids, np.array([8, 8]))
        with pytest.raises(ValueError, match="non-negative int32"):
            cs.add(np.array([0, 3]), np.array([0, -1, 2]), np.array([8]))
        with pytest.raises(ValueError, match="non-negative token counts"):
            cs.add(np.array([0, 3]), ids, np.array([12]))
            cs.finish(3, [-4])


@pytest.mark.parametrize("rule", ["trace", "vllm"])
def test_deferred_lru_renumbers_and_keeps_the_table(rule: str, tmp_path: Path) -> None:
    """defer_lru runs the same LRU pass from the spills in finish(), small reads and tree included."""
    log = long_log(1500, seed=2)
    offsets, ids, prompts, n = log
    want = capacity_curve(offsets, ids, prompts, 4, rule, ids=(ids, n))
    cs = CapacityStream(4, rule, str(tmp_path), tree_floor=16, chunk_blocks=97, defer_lru=True)
    feed(cs, log, [1, 1, 2, 200, 201, 900])
    assert cs._lru_state[1] == 0  # nothing ran during add()
    assert_same(cs.finish(n), want)


@pytest.mark.parametrize("budget", [0, 640 << 20])
def test_opt_beside_the_deferred_lru_keeps_the_table(budget: int, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The OPT passes run beside the deferred LRU pass when both states fit the budget, after it otherwise:
    the same table either way."""
    log = long_log(800, seed=5)
    offsets, ids, prompts, n = log
    want = capacity_curve(offsets, ids, prompts, 4, "vllm", ids=(ids, n))
    fits: list[bool] = []
    check = CapacityStream._opt_fits_beside_lru
    monkeypatch.setattr(CapacityStream, "_opt_fits_beside_lru", lambda *a: fits.append(check(*a)) or fits[-1])
    cs = CapacityStream(4, "vllm", str(tmp_path), chunk_blocks=97, defer_lru=True, opt_budget_bytes=budget)
    feed(cs, log, [100, 500])
    assert_same(cs.finish(n), want)
    assert fits == [budget > 0]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=20, unique=True),
       st.integers(min_value=0, max_value=400_000))
def test_opt_groups_cover_every_capacity_within_budget(caps: list, budget: int) -> None:
    from prefixscan.reuse.capacity.stream import OPT_GROUP

    cs = CapacityStream(16, "vllm", tempfile.gettempdir(), opt_budget_bytes=budget)
    try:
        cs._total_blocks = 10_000
        groups = list(cs._groups(caps, 5000, cs._opt_bytes))
    finally:
        cs.close()
    assert sorted(c for g in groups for c in g) == sorted(caps)
    for g in groups:
        assert 1 <= len(g) <= OPT_GROUP
        if len(g) > 1:
            assert sum(cs._opt_bytes(c, 5000) for c in g) <= budget
