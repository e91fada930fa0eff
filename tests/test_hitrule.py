"""The hit rule has one home (`hashing.hit_cap_tokens`): every form of it agrees on the edge cases.

vLLM recomputes the last prompt token, so a prompt of exactly k full blocks hits at most k - 1 of them; a
hashed trace's blocks count at their true size. The forms checked here are all the paths that apply the
rule: the Python scalar, the compiled kernels' helper, the array forms (ideal cache, simulator workload),
the capacity curve's block weights and pool request shapes, the block pool kernel, the simulator's lookup
cap and its tokens for k blocks (`block_tokens`: both replay engines, the tiers, the policies), and the SQL
reuse stage.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from prefixscan.encode.hashing import counted_hit_blocks, hit_cap_tokens, hit_tokens, is_trace_rule
from prefixscan.reuse.capacity.table import block_weights
from prefixscan.reuse.hitrule import (
    block_tokens,
    cap_blocks,
    cap_blocks_array,
    cap_tokens,
    cap_tokens_array,
    hit_tokens_array,
)
from prefixscan.reuse.pool import pool_hits
from prefixscan.reuse.pool_fast import request_shape
from prefixscan.reuse.sql import HIT_SQL
from prefixscan.sim.outcome import max_hit_blocks
from prefixscan.sim.workload import build_workload

B = 4
# Prompt lengths around the block edges: 0 tokens, 1 token, exactly k blocks, one past, one short.
PROMPTS = [0, 1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 16]
KS = [0, 1, 2, 3, 4, 5]


def _expected(k: int, n: int, rule: str) -> int:
    """The rule as the engines state it, spelled out for the test (not imported)."""
    if k <= 0 or n <= 0:
        return 0
    if rule == "vllm":  # at least one prompt token is computed: whole blocks that end before the last token
        return min(k, (n - 1) // B) * B
    return min(k * B, n)


def test_named_edge_cases() -> None:
    assert hit_tokens(2, 8, B, "vllm") == 4  # a prompt of exactly 2 blocks: the last block is recomputed
    assert hit_tokens(2, 9, B, "vllm") == 8  # one token more: both blocks hit
    assert hit_tokens(1, 1, B, "vllm") == 0 and hit_tokens(1, 1, B, "trace") == 1  # 1 token
    assert hit_tokens(3, 0, B, "vllm") == hit_tokens(3, 0, B, "trace") == 0  # 0 tokens
    assert hit_tokens(3, 10, B, "trace") == 10  # the partial last block at its true size
    with pytest.raises(ValueError, match="unknown hit rule"):
        is_trace_rule("sglang")


@pytest.mark.parametrize("rule", ["vllm", "trace"])
def test_every_form_agrees_with_the_home(rule: str) -> None:
    trace = rule == "trace"
    n_arr = np.array(PROMPTS, np.int64)
    assert cap_tokens_array(n_arr, B, rule).tolist() == [hit_cap_tokens(n, B, trace) for n in PROMPTS]
    assert cap_blocks_array(n_arr, B, rule).tolist() == [-(-hit_cap_tokens(n, B, trace) // B) for n in PROMPTS]
    for n in PROMPTS:
        assert cap_tokens(n, B, trace) == hit_cap_tokens(n, B, trace)  # the compiled function is the home
        assert cap_blocks(n, B, trace) == -(-hit_cap_tokens(n, B, trace) // B)
        for k in KS:
            assert hit_tokens(k, n, B, rule) == _expected(k, n, rule), (k, n)
    ks = np.repeat(KS, len(PROMPTS))
    ns = np.tile(PROMPTS, len(KS))
    want = [_expected(int(k), int(n), rule) for k, n in zip(ks, ns, strict=True)]
    assert hit_tokens_array(ks, ns, B, rule).tolist() == want


@pytest.mark.parametrize("rule", ["vllm", "trace"])
def test_capacity_weights_and_pool_shapes_follow_the_rule(rule: str) -> None:
    listed = [(n // B if rule == "vllm" else -(-n // B)) for n in PROMPTS]  # full blocks / a trace's listing
    offsets = np.concatenate([[0], np.cumsum(listed)]).astype(np.int64)
    prompts = np.array(PROMPTS, np.int64)
    w = block_weights(offsets, prompts, B, rule)
    cap, _ = request_shape(offsets, prompts, B, rule)
    for r, n in enumerate(PROMPTS):
        cum = np.concatenate([[0], np.cumsum(w[offsets[r]:offsets[r + 1]])])
        assert cum.tolist() == [_expected(k, n, rule) for k in range(listed[r] + 1)]
        assert cap[r] == min(listed[r], -(-_expected(listed[r] + 1, n, rule) // B))


@pytest.mark.parametrize("rule", ["vllm", "trace"])
def test_the_pool_kernel_applies_the_rule(rule: str) -> None:
    """Each prompt sent twice into a pool big enough to keep it: the second copy hits what the rule allows."""
    listed = [(n // B if rule == "vllm" else -(-n // B)) for n in PROMPTS]
    blocks, prompts = [], []
    for r, (n, m) in enumerate(zip(PROMPTS, listed, strict=True)):
        ids = [1000 * (r + 1) + j for j in range(m)]
        blocks += [ids, ids]
        prompts += [n, n]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blocks])]).astype(np.int64)
    hashes = np.array([h for b in blocks for h in b], np.uint64)
    got = pool_hits(offsets, hashes, np.array(prompts, np.int64), B, 1 << 12, rule)
    assert got[0::2].tolist() == [0] * len(PROMPTS)
    assert got[1::2].tolist() == [_expected(m, n, rule) for n, m in zip(PROMPTS, listed, strict=True)]


@pytest.mark.parametrize("rule", ["vllm", "trace"])
def test_the_simulator_workload_applies_the_rule(rule: str) -> None:
    listed = [(n // B if rule == "vllm" else -(-n // B)) for n in PROMPTS]
    table = pa.table({
        "seq": np.arange(len(PROMPTS), dtype=np.int64), "request_id": [f"r{i}" for i in range(len(PROMPTS))],
        "arrival_s": np.arange(len(PROMPTS), dtype=np.float64),
        "prompt_tokens": np.array(PROMPTS, np.int64),
        "output_tokens": np.ones(len(PROMPTS), np.int64),
        "block_hashes": pa.array([[7 * (i + 1) + j for j in range(m)] for i, m in enumerate(listed)],
                                 pa.list_(pa.uint64())),
    })
    w = build_workload(table, block_size=B, hit_rule=rule)
    assert w.hit_cap.tolist() == [hit_cap_tokens(n, B, rule == "trace") for n in PROMPTS]
    for i, n in enumerate(PROMPTS):
        cap = int(w.hit_cap[i])
        assert [block_tokens(k, B, cap) for k in KS] == [_expected(k, n, rule) for k in KS]
        assert block_tokens(np.array(KS, np.int32), B, w.hit_cap[i]).tolist() == [_expected(k, n, rule) for k in KS]
    pin = np.array(listed, np.int64)
    assert max_hit_blocks(w, pin).tolist() == [min(m, -(-_expected(m + 1, n, rule) // B))
                                              for n, m in zip(PROMPTS, listed, strict=True)]


@pytest.mark.parametrize("rule", ["vllm", "trace"])
def test_the_simulators_tokens_for_k_blocks(rule: str) -> None:
    """`block_tokens` (the replay engines, tiers and policies call it) at the edges: 0 tokens, 1 token, a
    prompt of exactly k blocks, one token short of it and one past it."""
    trace = rule == "trace"
    for k in (1, 2, 3):
        for n in (0, 1, k * B - 1, k * B, k * B + 1):
            cap = hit_cap_tokens(n, B, trace)
            assert block_tokens(k, B, cap) == _expected(k, n, rule), (k, n)
            assert isinstance(block_tokens(k, B, cap), int)  # a Python int back for the readable engine
    assert block_tokens(2, B, hit_cap_tokens(8, B, False)) == 4  # exactly 2 blocks: the last one recomputed
    assert block_tokens(2, B, hit_cap_tokens(9, B, False)) == 8  # one token past: both hit
    assert block_tokens(2, B, hit_cap_tokens(7, B, False)) == 4  # one short: one full block before the last token
    assert block_tokens(0, B, hit_cap_tokens(9, B, True)) == 0


@pytest.mark.parametrize("rule", ["vllm", "trace"])
def test_the_sql_form_agrees(rule: str) -> None:
    con = duckdb.connect()
    rows = [(k, n) for k in KS for n in PROMPTS]
    con.execute("CREATE TABLE u (k BIGINT, n BIGINT)")
    con.executemany("INSERT INTO u VALUES (?, ?)", rows)
    got = con.execute(f"SELECT {HIT_SQL[rule].format(k='u.k', B=B)} FROM u ORDER BY rowid").fetchall()
    assert [g[0] for g in got] == [hit_tokens(k, n, B, rule) for k, n in rows]


def test_counted_hit_blocks() -> None:
    assert counted_hit_blocks(hit_tokens(2, 8, B, "vllm"), 2, B, "vllm") == 1  # the recomputed block not counted
    assert counted_hit_blocks(hit_tokens(3, 10, B, "trace"), 3, B, "trace") == 3
