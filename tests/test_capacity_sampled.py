"""Sampled capacity curves (SHARDS with the hottest blocks exact) against the exact pool curve."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixscan.reuse.capacity.lru import capacity_curve, prepare
from prefixscan.reuse.capacity.sampled import (
    HOT_DEFAULT,
    MG_PER_HOT,
    SALTS_DEFAULT,
    SampledCurve,
    array_chunks,
    auto_rate,
    check_rate,
    curve_from_chunks,
    first_pass,
    histograms,
    hot_set,
    salt_keys,
)
from prefixscan.reuse.capacity.table import block_weights, capacity_sampling
from prefixscan.reuse.pool_fast import lru_pool_curves, request_shape
from tests.oracles import capacity_sampled_ref as ref


def sampled_pool_curve(offsets: np.ndarray, ids: np.ndarray, n_distinct: int, weights: np.ndarray,
                       unlisted: np.ndarray, rate: float, hot: int = HOT_DEFAULT, salts: int = SALTS_DEFAULT,
                       seed: int = 0, ideal: int | None = None) -> SampledCurve:
    """The sampled curve of an in-memory log (the product reads chunks: `curve_from_chunks`): the pool's
    hit at every size from a rate-`rate` sample of blocks plus the `hot` hottest.

    `ids`: dense block ids (int32, below n_distinct, first-seen order; `prefixscan.encode.dense.dense_ids`);
    `weights`: the tokens each listed block adds to its request's hit (`capacity_table.block_weights`); `unlisted`:
    per request, the blocks it occupies beyond its listing (`pool_fast.request_shape`); `ideal`: the exact
    infinite-cache hit, if known (then the sampled part is scaled to it). Rate 1 is the exact curve."""
    w = np.ascontiguousarray(weights, dtype=np.int64)
    unl = np.ascontiguousarray(unlisted, dtype=np.int64)
    off = np.ascontiguousarray(offsets, dtype=np.int64)
    chunks = array_chunks(off, ids, lambda _, r0, r1: w[off[r0]:off[r1]], lambda _, r0, r1: unl[r0:r1])
    return curve_from_chunks(chunks, n_distinct, rate, hot, salts, seed, ideal is not None, ideal)[0]


def workload(seed: int, n: int = 400, block: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chained requests: a few hot system prompts, conversations that grow, unique tails; whole listings
    (every block listed, the last one partial), as a Mooncake trace is."""
    rng = np.random.default_rng(seed)
    rows, next_id = [], 10_000
    systems = [list(range(s * 100, s * 100 + int(rng.integers(2, 8)))) for s in range(5)]
    convs: list[list[int]] = []
    for _ in range(n):
        if convs and rng.random() < 0.5:
            c = convs[int(rng.integers(len(convs)))]
            c += list(range(next_id, next_id + int(rng.integers(1, 4))))
        else:
            c = list(systems[int(rng.integers(len(systems)))]) + list(range(next_id, next_id + int(rng.integers(1, 6))))
            convs.append(c)
        next_id += 6
        rows.append(list(c))
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    hashes = np.concatenate([np.asarray(r, np.uint64) for r in rows])
    prompt = np.asarray([block * len(r) - int(rng.integers(0, block)) for r in rows], np.int64)
    return offsets, hashes, prompt


def exact_pool(offsets, hashes, prompt, rule="trace", block=16):
    prep = prepare(offsets, hashes, prompt, block, rule)
    keyed, fast = lru_pool_curves(prep.offsets, prep.ids, prep.weights, prep.n_distinct, prompt, block, rule)
    return prep, keyed, fast


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["trace", "vllm"]))
def test_rate_one_is_the_exact_curve(seed: int, rule: str) -> None:
    offsets, hashes, prompt = workload(seed, 120)
    prep, _, fast = exact_pool(offsets, hashes, prompt, rule)
    _, unl = request_shape(offsets, prompt, 16, rule)
    got = sampled_pool_curve(prep.offsets, prep.ids, prep.n_distinct, prep.weights, unl, 1.0)
    sizes = np.arange(fast.lo, prep.n_distinct + 8)
    exact = [fast.at(int(s)) for s in sizes if fast.covers(int(s))]
    assert got.at(sizes[: len(exact)])[0].tolist() == exact and len(exact) > 0
    assert got.kept_blocks == prep.n_distinct and got.hot == 0 and got.salts == 1
    table = capacity_curve(offsets, hashes, prompt, 16, rule, [int(s) * 16 for s in sizes[: len(exact)]], sample=1.0)
    assert table["lru_hit_tokens"].to_pylist() == exact and capacity_sampling(table) is None


def test_band_covers_the_exact_value_at_most_points() -> None:
    """Five salts at rate 0.2 on eight small random traces: the exact hit lies inside the band at most grid
    points taken together (the band is the salts' spread, so it misses where all salts err the same way;
    on the 1M bench trace it covered 50-88%), and every estimate stays within 3 points of it."""
    covered = []
    for seed in range(8):
        offsets, hashes, prompt = workload(seed, 1500)
        prep, keyed, fast = exact_pool(offsets, hashes, prompt)
        _, unl = request_shape(offsets, prompt, 16, "trace")
        sizes = np.unique(np.geomspace(fast.lo, prep.n_distinct, 12).astype(np.int64))
        exact = np.array([fast.at(int(s)) for s in sizes], float)
        sc = sampled_pool_curve(prep.offsets, prep.ids, prep.n_distinct, prep.weights, unl, 0.2, hot=32, salts=5,
                                seed=seed, ideal=int(keyed[-1]))
        est, low, high = sc.at(sizes)
        assert np.all(low <= est) and np.all(est <= high)
        covered += ((low <= exact + 1e-6) & (exact - 1e-6 <= high)).tolist()
        assert np.max(np.abs(est - exact)) / prompt.sum() < 0.03
        assert sc.kept_blocks < prep.n_distinct
    assert np.mean(covered) > 0.5


def test_deterministic_and_the_table_says_it_is_sampled() -> None:
    offsets, hashes, prompt = workload(7, 2000)
    a = capacity_curve(offsets, hashes, prompt, 16, "trace", sample=0.1)
    b = capacity_curve(offsets, hashes, prompt, 16, "trace", sample=0.1)
    assert a.equals(b, check_metadata=True)
    exact = capacity_curve(offsets, hashes, prompt, 16, "trace")
    assert a["ideal_hit_tokens"].to_pylist() == exact["ideal_hit_tokens"].to_pylist()  # the ideal stays exact
    assert set(a["lru_sampled"].to_pylist()) == {True} and set(exact["lru_sampled"].to_pylist()) == {False}
    assert a["opt_hit_rate"].null_count == a.num_rows and exact["opt_hit_rate"].null_count == 0
    assert exact["lru_hit_rate_low"].equals(exact["lru_hit_rate"])
    meta = capacity_sampling(a)
    assert meta is not None and meta["rate"] == 0.1 and meta["salts"] == 3
    lo, hi = np.array(a["lru_hit_rate_low"].to_pylist()), np.array(a["lru_hit_rate_high"].to_pylist())
    assert np.all(lo <= np.array(a["lru_hit_rate"].to_pylist()) + 1e-12) and np.all(lo <= hi)


def test_hot_blocks_are_the_most_referenced() -> None:
    ids = np.concatenate([np.repeat(np.arange(20, dtype=np.int32), 200 - 5 * np.arange(20)),
                          np.arange(20, 5000, dtype=np.int32)])
    np.random.default_rng(0).shuffle(ids)
    assert ref.hot_blocks(ids, 5000, 5).tolist() == [0, 1, 2, 3, 4]
    assert _hot(ids, 5).tolist() == [0, 1, 2, 3, 4]  # Misra-Gries candidates (all above N/81), exact counts
    assert len(_hot(np.arange(100, dtype=np.int32), 5)) == 0  # nothing referenced twice
    h = np.repeat(np.arange(1000, dtype=np.int32), 3)
    c = sampled_pool_curve(np.arange(0, len(h) + 1, 3), h, 1000, np.full(len(h), 16), np.zeros(1000, np.int64),
                           0.25, hot=0, salts=1)
    assert 150 < c.kept_blocks < 350  # a quarter of the blocks, each with every reference


def _hot(ids: np.ndarray, k: int, chunk: int = 1 << 21) -> np.ndarray:
    offsets = np.arange(len(ids) + 1, dtype=np.int64)
    chunks = array_chunks(offsets, ids, lambda o, *_: np.ones(len(o) - 1, np.int64),
                          lambda o, *_: np.zeros(len(o) - 1, np.int64), chunk)
    return hot_set(chunks, first_pass(chunks, k).candidates, k)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 12), st.integers(1, 400), st.floats(0.3, 2.0))
def test_hot_set_holds_every_heavy_hitter(seed: int, k: int, chunk: int, skew: float) -> None:
    """Misra-Gries with 4k counters keeps every block with more than N/(4k+1) references (Misra and Gries
    1982); the hot set is then the exact top k among them, so it is the exact top k whenever those are."""
    ids = (np.random.default_rng(seed).zipf(1.0 + skew, 3000) - 1).astype(np.int32) % 2000
    got = _hot(ids, k, chunk)
    counts = np.bincount(ids)
    want = ref.hot_blocks(ids, int(ids.max()) + 1, k)
    assert len(got) <= k and np.all(counts[got] >= 2) and np.all(np.diff(counts[got]) <= 0)
    heavy = set(np.flatnonzero(counts > len(ids) / (MG_PER_HOT * k + 1)).tolist())
    assert heavy & set(want.tolist()) <= set(got.tolist())
    if counts[want].min(initial=0) > len(ids) / (MG_PER_HOT * k + 1):
        assert got.tolist() == want.tolist()


def scrambled(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests of skewed random blocks in any order (not chained): hot blocks anywhere in a request, mixed
    with sampled ones, so no run of hot blocks shares its clocks by construction."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 9, n)
    hashes = (rng.zipf(1.4, int(lens.sum())) % 90).astype(np.uint64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return offsets, hashes, lens * 16 - rng.integers(0, 16, n) * (lens > 0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 150), st.sampled_from([1.0, 0.5, 0.2, 0.05]), st.integers(0, 12),
       st.integers(1, 3), st.integers(1, 200), st.booleans(), st.booleans(), st.sampled_from(["trace", "vllm"]))
def test_fast_pass_equals_the_reference(seed: int, n: int, rate: float, hot: int, salts: int, chunk: int,
                                        tiny: bool, chained: bool, rule: str) -> None:
    """The compiled pass (shared hot tree, global hot clocks, memoised runs, chunks, renumbering) gives
    the definition's histograms bin for bin (`capacity_sampled_ref`), with trees so small they renumber
    at almost every access when `tiny`."""
    offsets, hashes, prompt = workload(seed, n) if chained else scrambled(seed, n)
    prep = prepare(offsets, hashes, prompt, 16, rule)
    _, unl = request_shape(prep.offsets, prompt, 16, rule)
    w = prep.weights
    chunks = array_chunks(prep.offsets, prep.ids, lambda _, r0, r1: w[prep.offsets[r0]:prep.offsets[r1]],
                          lambda _, r0, r1: unl[r0:r1], chunk)
    fp = first_pass(chunks, hot)
    hot_ids = hot_set(chunks, fp.candidates, hot)
    keys = salt_keys(salts, seed)
    hh, hs, width, _ = histograms(chunks, prep.n_distinct, hot_ids, rate, keys, fp.most_unlisted,
                                  1 if tiny else None, 1 if tiny else None)
    unl_prev = np.concatenate([[0], unl[:-1]]).astype(np.int64)
    rh, rs = ref.histograms(prep.offsets, prep.ids, w, unl_prev, hot_ids, rate, keys, width, hh.shape[1])
    assert np.array_equal(hh, rh) and np.array_equal(hs, rs)
    keyed, _ = lru_pool_curves(prep.offsets, prep.ids, w, prep.n_distinct, prompt, 16, rule)
    assert fp.ideal == int(keyed[-1]) and fp.references == len(prep.ids)


def test_compiled_splitmix_is_splitmix() -> None:
    from prefixscan.reuse.capacity.sampled_kernel import splitmix64

    for x in (0, 1, 12345, 2**63 + 7, 2**64 - 1):
        assert int(splitmix64(np.uint64(x))) == ref.splitmix64(x)


def test_bad_options_are_refused_in_one_line(tmp_path) -> None:
    for bad in (0, -0.1, 1.5, "x", float("nan")):
        with pytest.raises(ValueError, match="sampling rate"):
            check_rate(bad)
    assert auto_rate(1, 10**12) is None and auto_rate(0.01, 5) == 0.01
    assert auto_rate(None, 10) is None and auto_rate(None, 10**12) == 0.01
    with pytest.raises(ValueError, match="salts"):
        sampled_pool_curve(np.array([0, 1]), np.array([0], np.int32), 1, np.array([16]), np.zeros(1, np.int64),
                           0.5, salts=0)
    from prefixscan.cli.app import app

    log = tmp_path / "t.jsonl"
    log.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n')
    res = CliRunner().invoke(app, ["analyze", str(log), "--capacity-sample", "2", "-o", str(tmp_path / "r")])
    assert res.exit_code == 2 and "--capacity-sample must be in (0, 1]" in res.output
    assert "Traceback" not in res.output


def test_block_weights_feed_the_sampler() -> None:
    offsets, hashes, prompt = workload(3, 50)
    w = block_weights(offsets, prompt, 16, "trace")
    assert w.sum() == prompt.sum()


def test_streamed_sampled_curve_equals_the_in_memory_one(tmp_path) -> None:
    from prefixscan.encode.dense import dense_ids
    from prefixscan.reuse.capacity.stream import CapacityStream

    offsets, hashes, prompt = workload(5, 900)
    ids, n = dense_ids(hashes)
    whole = capacity_curve(offsets, hashes, prompt, 16, "trace", ids=(ids, n), sample=0.2)
    s = CapacityStream(16, "trace", str(tmp_path), defer_lru=True, chunk_blocks=300)  # spills read in chunks
    for r0 in range(0, len(prompt), 250):
        r1 = min(r0 + 250, len(prompt))
        s.add(offsets[r0:r1 + 1] - offsets[r0], ids[offsets[r0]:offsets[r1]], prompt[r0:r1])
    assert s.finish(n, sample=0.2).equals(whole, check_metadata=True)
    assert not list(tmp_path.iterdir())  # the spills are gone


def test_analyze_samples_when_asked_and_says_so(tmp_path) -> None:
    """End to end: analyze's streamed capacity step samples, the table and the manifest say so, and the
    summary's note names the rate; the ideal column is the exact run's."""
    import json

    import pyarrow.parquet as pq

    from prefixscan.cli.app import app

    offsets, hashes, prompt = workload(2, 600)
    log = tmp_path / "t.jsonl"
    log.write_text("".join(json.dumps({"timestamp": i, "input_length": int(prompt[i]) * 32, "output_length": 1,
                                       "hash_ids": hashes[offsets[i]:offsets[i + 1]].tolist()}) + "\n"
                           for i in range(len(prompt))))
    runs = {}
    for name, rate in (("exact", "1"), ("sampled", "0.5")):
        res = CliRunner().invoke(app, ["analyze", str(log), "--capacity-sample", rate, "-o", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        runs[name] = pq.read_table(tmp_path / name / "capacity_curve.parquet")
    assert set(runs["sampled"]["lru_sampled"].to_pylist()) == {True}
    assert set(runs["exact"]["lru_sampled"].to_pylist()) == {False}
    assert runs["sampled"]["ideal_hit_tokens"].equals(runs["exact"]["ideal_hit_tokens"])
    summary = json.loads((tmp_path / "sampled" / "manifest.json").read_text())["analyze"]["summary"]
    assert summary["capacity"]["sampled"]["rate"] == 0.5
    assert "sampled as asked (--capacity-sample): SHARDS at rate 0.5" in json.dumps(summary)
