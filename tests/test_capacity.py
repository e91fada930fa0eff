"""Capacity curves: fast one-pass LRU and numba OPT against the slow references, plus Mooncake Fig. 9."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.encode.hashing import hit_tokens
from prefixscan.reuse.capacity.lru import capacity_curve, opt_hits, prepare
from prefixscan.reuse.capacity.table import SCHEMA, block_weights, default_capacities
from tests.oracles.capacity_ref import ideal_hit_tokens_ref, lru_hit_tokens_ref, opt_hit_tokens_ref
from tests.oracles.lru_stack import lru_curves, lru_hit_tokens_all_capacities

MOONCAKE = Path("/work/shared/data/mooncake/synthetic_trace.jsonl")
# Mooncake (FAST'25) Figure 9, one LRU cache: capacity in tokens -> token-weighted hit rate.
MOONCAKE_FIG9 = {
    1_000_000: 0.146, 2_000_000: 0.2345, 4_000_000: 0.3805, 5_000_000: 0.4352,
    8_000_000: 0.5447, 10_000_000: 0.5886, 50_000_000: 0.6582,
}


def csr(requests: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Requests as lists of block ids -> (offsets, uint64 hashes)."""
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in requests])]).astype(np.int64)
    flat = [b for r in requests for b in r]
    return offsets, np.array(flat, dtype=np.uint64)


@st.composite
def traces(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, str]:
    """Random chained prefix structures: each request walks a trie over a small alphabet, so requests
    share prefixes, diverge and come back; block ids are trie nodes scrambled into uint64 hashes."""
    block_size = draw(st.integers(1, 4))
    rule = draw(st.sampled_from(["vllm", "trace"]))
    alphabet = draw(st.integers(1, 3))
    n_req = draw(st.integers(0, 22))
    nodes: dict[tuple[int, ...], int] = {}
    requests: list[list[int]] = []
    prompts: list[int] = []
    for _ in range(n_req):
        labels = draw(st.lists(st.integers(0, alphabet - 1), max_size=8))
        blocks = []
        for d in range(1, len(labels) + 1):
            node = nodes.setdefault(tuple(labels[:d]), len(nodes))
            blocks.append((node * 0x9E3779B97F4A7C15 + 12345) % 2**64)
        requests.append(blocks)
        prompts.append(draw(st.integers(0, (len(blocks) + 1) * block_size)))
    offsets, hashes = csr(requests)
    return offsets, hashes, np.array(prompts, dtype=np.int64), block_size, rule


@settings(max_examples=150, deadline=None)
@given(traces())
def test_block_weights_sum_to_hit_tokens(trace: tuple) -> None:
    offsets, _, prompts, bs, rule = trace
    w = block_weights(offsets, prompts, bs, rule)
    for i in range(len(prompts)):
        cum = np.concatenate([[0], np.cumsum(w[offsets[i] : offsets[i + 1]])])
        for k in range(len(cum)):
            assert cum[k] == hit_tokens(k, int(prompts[i]), bs, rule)


@settings(max_examples=200, deadline=None)
@given(traces())
def test_lru_one_pass_equals_reference_at_every_capacity(trace: tuple) -> None:
    offsets, hashes, prompts, bs, rule = trace
    prep = prepare(offsets, hashes, prompts, bs, rule)
    tok, blk = lru_curves(prep)
    assert len(tok) == prep.n_distinct + 1
    for c in range(prep.n_distinct + 3):
        assert (tok[min(c, prep.n_distinct)], blk[min(c, prep.n_distinct)]) == lru_hit_tokens_ref(
            offsets, hashes, prompts, bs, rule, c)
    assert tok[-1] == ideal_hit_tokens_ref(offsets, hashes, prompts, bs, rule)


@settings(max_examples=150, deadline=None)
@given(traces())
def test_opt_equals_reference_and_bounds_lru(trace: tuple) -> None:
    offsets, hashes, prompts, bs, rule = trace
    prep = prepare(offsets, hashes, prompts, bs, rule)
    caps = list(range(prep.n_distinct + 2))
    opt_tok, opt_blk = opt_hits(prep, caps)
    lru_tok, lru_blk = lru_curves(prep)
    for c in caps:
        assert (opt_tok[c], opt_blk[c]) == opt_hit_tokens_ref(offsets, hashes, prompts, bs, rule, c)
        # OPT >= LRU holds in blocks; token hits weigh blocks unequally (partial last block, vLLM cap).
        assert lru_blk[min(c, prep.n_distinct)] <= opt_blk[c] <= lru_blk[-1]
        assert opt_tok[c] <= lru_tok[-1]


def conversation_trace(n_req: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sessions that grow turn by turn on top of a few shared system prompts, plus a unique last block."""
    rng = np.random.default_rng(seed)
    template_of = rng.integers(0, 4, size=60)
    turns: dict[int, int] = {}
    requests = []
    for i in range(n_req):
        s = int(rng.integers(0, 60))
        turns[s] = turns.get(s, 0) + 1
        t = int(template_of[s])
        blocks = [1000 + 100 * t + j for j in range(1 + t)]
        blocks += [10**6 + 1000 * s + j for j in range(min(2 * turns[s], 12))]
        requests.append(blocks + [10**9 + i])
    offsets, hashes = csr(requests)
    prompts = np.diff(offsets) * 4 - rng.integers(0, 4, size=n_req)
    return offsets, hashes, prompts


@pytest.mark.parametrize("rule", ["trace", "vllm"])
def test_longer_trace_small_capacities(rule: str) -> None:
    # Long enough, with small capacities, that the OPT heap is compacted many times.
    offsets, hashes, prompts = conversation_trace(300, seed=7)
    prep = prepare(offsets, hashes, prompts, 4, rule)
    caps = [0, 1, 2, 3, 5, 8, 13, 40]
    opt_tok, opt_blk = opt_hits(prep, caps)
    lru_tok, lru_blk = lru_curves(prep)
    for i, c in enumerate(caps):
        assert (lru_tok[c], lru_blk[c]) == lru_hit_tokens_ref(offsets, hashes, prompts, 4, rule, c)
        assert (opt_tok[i], opt_blk[i]) == opt_hit_tokens_ref(offsets, hashes, prompts, 4, rule, c)


def test_head_blocks_outlive_tail_blocks() -> None:
    # After [1,2,3] then [4,5] with room for 4 blocks, vLLM evicts block 3 (the tail), so [1,2,3]
    # still hits 2 blocks. Evicting in forward order would lose block 1 and hit nothing.
    offsets, hashes = csr([[1, 2, 3], [4, 5], [1, 2, 3]])
    prompts = np.array([3, 2, 3])
    curve = lru_hit_tokens_all_capacities(offsets, hashes, prompts, 1, "trace")
    assert list(curve) == [0, 0, 0, 1, 2, 3]
    assert curve[4] == lru_hit_tokens_ref(offsets, hashes, prompts, 1, "trace", 4)[0] == 2


def test_request_larger_than_capacity_keeps_its_head() -> None:
    offsets, hashes = csr([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6]])
    prompts = np.array([10, 12])
    # pools of 0, 1, 2, 3, 50 blocks; block 0 is vLLM's null block, so N - 1 blocks hold cache
    table = capacity_curve(offsets, hashes, prompts, 2, "trace", [0, 2, 4, 6, 100])
    assert table["lru_hit_tokens"].to_pylist() == [0, 0, 2, 4, 10]
    assert table["opt_hit_tokens"].to_pylist() == [0, 0, 2, 4, 10]
    assert table["capacity_blocks"].to_pylist() == [0, 1, 2, 3, 50]


def test_vllm_rule_recomputes_last_token() -> None:
    offsets, hashes = csr([[7, 8], [7, 8]])
    prompts = np.array([32, 32])  # an identical 32-token repeat hits 16 tokens (docs/engines.md, 'The hit rule')
    table = capacity_curve(offsets, hashes, prompts, 16, "vllm", [32, 1024])
    assert table["lru_hit_tokens"].to_pylist() == [16, 16]
    assert table["ideal_hit_rate"].to_pylist() == [0.25, 0.25]


def test_table_schema_defaults_and_empty_input() -> None:
    offsets, hashes = csr([[1, 2], [1, 3], [1, 2]])
    prompts = np.array([2, 2, 2])
    table = capacity_curve(offsets, hashes, prompts, 1, "trace")
    assert table.schema == SCHEMA
    assert table["capacity_tokens"].to_pylist() == default_capacities(3, 1)
    empty = capacity_curve(np.zeros(1, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64), 16, "vllm")
    assert empty.num_rows == 0 and empty.schema == SCHEMA
    no_opt = capacity_curve(offsets, hashes, prompts, 1, "trace", [1, 2], opt=False)
    assert no_opt["opt_hit_rate"].null_count == 2
    zero = capacity_curve(np.array([0, 0]), np.zeros(0, np.uint64), np.array([0]), 4, "vllm", [8])
    assert zero["lru_hit_rate"].to_pylist() == [0.0]


def test_default_capacities_grid() -> None:
    grid = default_capacities(100_000, 512)
    assert 14 <= len(grid) <= 16
    assert grid == sorted(set(grid)) and grid[-1] == 100_000 * 512
    assert all(c % 512 == 0 and c > 0 for c in grid)
    assert default_capacities(0, 16) == []
    assert default_capacities(1, 16) == [16]


def test_bad_input_is_rejected() -> None:
    offsets, hashes = csr([[1, 2]])
    with pytest.raises(ValueError, match="rule"):
        capacity_curve(offsets, hashes, np.array([2]), 1, "sglang")
    with pytest.raises(ValueError, match="hashes"):
        capacity_curve(offsets, hashes[:1], np.array([2]), 1, "vllm")
    with pytest.raises(ValueError, match="non-negative"):
        capacity_curve(offsets, hashes, np.array([2]), 1, "vllm", [-1])


def test_accepts_arrow_list_array() -> None:
    arr = pa.array([[5, 6], [5, 6, 7]], type=pa.list_(pa.uint64()))
    table = capacity_curve(arr.offsets.to_numpy(), arr.values.to_numpy(), np.array([2, 3]), 1, "trace", [3])
    assert table["lru_hit_tokens"].to_pylist() == [2]


@pytest.mark.skipif(not MOONCAKE.exists(), reason="Mooncake trace not available")
def test_mooncake_figure9_single_lru() -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    offsets, hashes = csr([r["hash_ids"] for r in rows])
    prompts = np.array([r["input_length"] for r in rows], dtype=np.int64)
    table = capacity_curve(offsets, hashes, prompts, 512, "trace", list(MOONCAKE_FIG9))
    assert table["ideal_hit_rate"][0].as_py() == pytest.approx(0.651244, abs=1e-6)
    for published, lru, opt in zip(MOONCAKE_FIG9.values(), table["lru_hit_rate"].to_pylist(),
                                   table["opt_hit_rate"].to_pylist(), strict=True):
        assert lru == pytest.approx(published, abs=0.015)
        assert lru - 1e-9 <= opt <= 0.651244 + 1e-6


def test_capacity_targets_are_the_exact_smallest_capacities() -> None:
    """The summary's "tokens for 50%/90% of ideal" are pool sizes between the grid points where vLLM's pool
    reaches the fraction and one block less does not (tests/test_pool.py checks the crossing itself)."""
    from prefixscan.reuse.capacity.table import capacity_targets

    rng = np.random.default_rng(5)
    rows = [rng.integers(0, 40, size=rng.integers(1, 9)).cumsum() for _ in range(300)]  # shared prefixes
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    flat = np.concatenate(rows).astype(np.uint64)
    prompt = np.array([len(r) * 4 + 1 for r in rows], dtype=np.int64)
    table = capacity_curve(offsets, flat, prompt, 4, "vllm")
    targets = capacity_targets(table)
    ideal = table["ideal_hit_tokens"][0].as_py()
    for frac in (0.5, 0.9):
        tokens = targets[f"lru_tokens_for_{int(frac * 100)}pct_of_ideal"]
        grid = [c for c, h in zip(table["capacity_tokens"].to_pylist(), table["lru_hit_tokens"].to_pylist(),
                                  strict=True) if h >= frac * ideal]
        assert tokens <= grid[0]
        assert capacity_curve(offsets, flat, prompt, 4, "vllm", [tokens], opt=False)["lru_hit_tokens"][0].as_py() \
            >= frac * ideal > capacity_curve(offsets, flat, prompt, 4, "vllm", [tokens - 4], opt=False)[
                "lru_hit_tokens"][0].as_py()
