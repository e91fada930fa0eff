"""vLLM's block pool: the reference and the compiled pool against cached tokens recorded from vLLM 0.32.0's
own scheduler and KV cache manager (tests/data/README_vllm_pool.md), and against each other."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.encode.dense import dense_ids
from prefixscan.encode.hashing import hit_cap_tokens
from prefixscan.reuse.capacity.lru import capacity_curve
from prefixscan.reuse.capacity.table import capacity_targets
from prefixscan.reuse.pool import longest_request, new_state, pool_curve, pool_hits, run_chunk, run_each
from prefixscan.sim.kvcache import KVState
from tests.oracles.capacity_ref import opt_hit_tokens_ref
from tests.oracles.pool_ref import ReferencePool, pool_hits_ref
from tests.test_capacity import csr, traces
from tests.test_pool_fast import scrambled

CASES = json.loads((Path(__file__).parent / "data" / "vllm_pool_cases.json").read_text())["cases"]
ONE_AT_A_TIME = [c for c in CASES if c["kind"].startswith("one_at_a_time")]
INTERLEAVED = [c for c in CASES if c["kind"] == "interleaved"]


def as_csr(case: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    offsets, hashes = csr([r["blocks"] for r in case["requests"]])
    prompts = np.array([r["prompt_tokens"] for r in case["requests"]], dtype=np.int64)
    return offsets, hashes, prompts, np.array([r["cached_tokens"] for r in case["requests"]])


def case_id(c: dict) -> str:
    return f'{c["kind"]}-B{c["block_size"]}-N{c["num_blocks"]}'


@pytest.mark.parametrize("case", ONE_AT_A_TIME, ids=case_id)
def test_equals_vllm_request_by_request(case: dict) -> None:
    offsets, hashes, prompts, vllm = as_csr(case)
    b, n = case["block_size"], case["num_blocks"]
    assert pool_hits_ref(offsets, hashes, prompts, b, n).tolist() == vllm.tolist()
    assert pool_hits(offsets, hashes, prompts, b, n).tolist() == vllm.tolist()
    table = capacity_curve(offsets, hashes, prompts, b, "vllm", [n * b], opt=False)
    assert table["lru_hit_tokens"].to_pylist() == [int(vllm.sum())]


@pytest.mark.parametrize("case", INTERLEAVED, ids=case_id)
def test_reference_pool_equals_vllm_with_running_requests(case: dict) -> None:
    """Concurrent requests (pinned blocks), decode steps that fill and hash new blocks, frees in any order."""
    b = case["block_size"]
    pool = ReferencePool(case["num_blocks"])
    for op in case["ops"]:
        if op["op"] == "start":
            n = op["prompt_tokens"]
            k = pool.start(op["id"], op["blocks"], -(-n // b), (n - 1) // b)
            assert (k * b if k >= 0 else -1) == op["cached_tokens"]
        elif op["op"] == "decode":
            assert pool.decode(op["id"], op["blocks"], op["tokens_before"], op["tokens_after"], b)
        else:
            pool.finish(op["id"])


def test_the_recorded_cases_exercise_every_rule() -> None:
    """Without the null block, partial blocks or duplicate copies the recorded hits would differ; this
    checks the fixtures are strong enough to see each one."""
    dups = 0
    for case in ONE_AT_A_TIME:
        offsets, hashes, prompts, _ = as_csr(case)
        pool = ReferencePool(case["num_blocks"])
        for i in range(len(prompts)):
            keys = hashes[offsets[i]:offsets[i + 1]].tolist()
            n = int(prompts[i])
            if -(-n // case["block_size"]) <= pool.num_blocks - 1:
                pool.start(i, keys, -(-n // case["block_size"]), (n - 1) // case["block_size"])
                pool.finish(i)
        dups += pool.duplicates
    assert dups > 0
    # a pool one block smaller (as if the null block were not there) or an LRU over listed blocks differs
    differ_null = differ_lru = 0
    for case in ONE_AT_A_TIME:
        offsets, hashes, prompts, vllm = as_csr(case)
        b, n = case["block_size"], case["num_blocks"]
        differ_null += int((pool_hits(offsets, hashes, prompts, b, n + 1) != vllm).sum())
        from tests.oracles.capacity_ref import lru_hit_tokens_ref

        differ_lru += lru_hit_tokens_ref(offsets, hashes, prompts, b, "vllm", n)[0] != vllm.sum()
    assert differ_null > 0 and differ_lru > 0


@settings(max_examples=200, deadline=None)
@given(traces())
def test_compiled_pool_equals_reference(trace: tuple) -> None:
    offsets, hashes, prompts, bs, rule = trace
    longest = int(np.diff(offsets).max(initial=0)) + 2
    for n in range(0, longest + 6):
        ref = pool_hits_ref(offsets, hashes, prompts, bs, n, rule)
        assert pool_hits(offsets, hashes, prompts, bs, n, rule).tolist() == ref.tolist()


@settings(max_examples=60, deadline=None)
@given(traces())
def test_capacity_table_is_the_pool_and_opt_gets_n_minus_1(trace: tuple) -> None:
    offsets, hashes, prompts, bs, rule = trace
    sizes = list(range(0, int(np.diff(offsets).sum()) + 3))
    table = capacity_curve(offsets, hashes, prompts, bs, rule, [s * bs for s in sizes])
    for s, lru, opt in zip(sizes, table["lru_hit_tokens"].to_pylist(), table["opt_hit_tokens"].to_pylist(),
                           strict=True):
        assert lru == int(pool_hits_ref(offsets, hashes, prompts, bs, s, rule).sum())
        assert opt == opt_hit_tokens_ref(offsets, hashes, prompts, bs, rule, max(s - 1, 0))[0]


def test_targets_are_crossings_of_the_pool_curve() -> None:
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, 40, size=rng.integers(1, 9)).cumsum() for _ in range(300)]  # shared prefixes
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    flat = np.concatenate(rows).astype(np.uint64)
    prompt = np.array([len(r) * 4 + (i % 2) for i, r in enumerate(rows)], dtype=np.int64)
    table = capacity_curve(offsets, flat, prompt, 4, "vllm")
    ideal = table["ideal_hit_tokens"][0].as_py()
    from prefixscan.encode.dense import dense_ids

    ids, n_distinct = dense_ids(flat)
    for frac, key in ((0.5, "lru_tokens_for_50pct_of_ideal"), (0.9, "lru_tokens_for_90pct_of_ideal")):
        size = capacity_targets(table)[key] // 4
        hit, below = pool_curve(offsets, ids, n_distinct, prompt, 4, "vllm", [size, size - 1])[0]
        assert hit >= frac * ideal > below


def test_one_replica_one_request_at_a_time_equals_the_pool() -> None:
    """The simulator's replica (KVState) run one request at a time, prefill only, is the same pool."""
    case = ONE_AT_A_TIME[3]
    offsets, hashes, prompts, vllm = as_csr(case)
    b, n = case["block_size"], case["num_blocks"]
    from prefixscan.encode.dense import dense_ids

    ids, u = dense_ids(hashes)
    kv = KVState(1, u, n)
    got = []
    for i in range(len(prompts)):
        blocks = ids[offsets[i]:offsets[i + 1]]
        p = int(prompts[i])
        table = np.zeros(-(-p // b), dtype=np.int32)
        k, _ = kv.admit(0, blocks, hit_cap_tokens(p, b, False) // b, len(table), float(i), table)
        got.append(k * b)
        kv.release(0, table, float(i) + 0.5)
    assert got == vllm.tolist()


@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("case", [ONE_AT_A_TIME[i] for i in (1, 7, 13, 17)], ids=case_id)
def test_one_replica_simulation_without_overlap_equals_vllm(case: dict, engine: str) -> None:
    """simulate() with one replica of N blocks and requests that never overlap (each finishes long before
    the next arrives, max_tokens=1) gives every request what vLLM's scheduler gave it."""
    import pyarrow as pa

    from prefixscan.sim import SimConfig, simulate

    reqs = case["requests"]
    table = pa.table({
        "seq": list(range(len(reqs))),
        "request_id": [f"r{i}" for i in range(len(reqs))],
        "arrival_s": [1000.0 * i for i in range(len(reqs))],
        "prompt_tokens": [r["prompt_tokens"] for r in reqs],
        "output_tokens": [1] * len(reqs),
        "block_hashes": pa.array([r["blocks"] for r in reqs], pa.list_(pa.uint64())),
    })
    cfg = SimConfig(replicas=1, kv_blocks=case["num_blocks"], policies=("round_robin",), prefill_model="preble",
                    tpot_s=0.01)
    res = simulate(table, cfg, block_size=case["block_size"], engine=engine)
    got = res.tables["sim_decisions"].sort_by("seq")["actual_cached_tokens"].to_pylist()
    assert got == [r["cached_tokens"] for r in reqs]


def _no_overlap_table(offsets: np.ndarray, hashes: np.ndarray, prompts: np.ndarray):
    import pyarrow as pa

    n = len(prompts)
    blocks = [hashes[offsets[i]:offsets[i + 1]].tolist() for i in range(n)]
    return pa.table({
        "seq": list(range(n)), "request_id": [f"r{i}" for i in range(n)],
        "arrival_s": [1000.0 * i for i in range(n)], "prompt_tokens": prompts.tolist(), "output_tokens": [1] * n,
        "block_hashes": pa.array(blocks, pa.list_(pa.uint64())),
    })


@settings(max_examples=25, deadline=None)
@given(traces(), st.integers(1, 14))
def test_one_replica_simulation_equals_the_reference_pool(trace: tuple, n_blocks: int) -> None:
    """Property: on random chained workloads (both hit rules, partial blocks, resends), a one-replica
    replay whose requests never overlap equals `pool_hits_ref` request by request, in both engines."""
    from prefixscan.sim import SimConfig, simulate

    offsets, hashes, prompts, bs, rule = trace
    if len(prompts) == 0 or prompts.sum() == 0:
        return
    table = _no_overlap_table(offsets, hashes, prompts)
    want = pool_hits_ref(offsets, hashes, prompts, bs, n_blocks, rule).tolist()
    cfg = SimConfig(replicas=1, kv_blocks=n_blocks, policies=("round_robin",), prefill_model="preble", tpot_s=0.01)
    for engine in ("reference", "fast"):
        res = simulate(table, cfg, block_size=bs, hit_rule=rule, engine=engine)
        assert res.tables["sim_decisions"].sort_by("seq")["actual_cached_tokens"].to_pylist() == want


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["vllm", "trace"]))
def test_compiled_pool_fed_in_chunks_equals_reference(seed: int, rule: str) -> None:
    """The kernel keeps the free queue's ends in locals and writes them back when a chunk ends: a pool fed
    chunk by chunk (as the streamed curve feeds it) gives the reference's hits request by request, with ids
    repeated inside requests (duplicate copies), oversized requests (the pool is cleared) and partial blocks."""
    rng = np.random.default_rng(seed)
    block = int(rng.choice([1, 2, 4]))
    rows, prompts = scrambled(rng, int(rng.integers(1, 40)), block)
    offsets, hashes = csr(rows)
    ids, n = dense_ids(hashes)
    longest = longest_request(offsets, prompts, block)
    for size in range(0, longest + 4):
        state = new_state(size, n, longest)
        out = np.zeros(len(prompts), np.int64)
        cuts = sorted({0, len(prompts), *rng.integers(0, len(prompts) + 1, 3).tolist()})
        for a, b in zip(cuts[:-1], cuts[1:], strict=False):
            run_chunk(state, offsets[a : b + 1] - offsets[a], ids[offsets[a] : offsets[b]], prompts[a:b], block, rule,
                      out[a:b])
        assert out.tolist() == pool_hits_ref(offsets, hashes, prompts, block, size, rule).tolist()


def test_run_each_keeps_order_balances_and_raises() -> None:
    """`run_each` gives results in task order, every thread takes the next task as it frees (the first task
    waits for the last one, which only another thread taking every task after it can run), its helpers are
    daemons, and a task's error is raised again in the caller once every thread stopped."""
    import threading

    last_ran = threading.Event()
    threads: list[threading.Thread] = []

    def task(i: int) -> int:
        threads.append(threading.current_thread())
        if i == 0:
            assert last_ran.wait(30), "the other thread did not take the remaining tasks"
        if i == 7:
            last_ran.set()
        return i * i

    tasks = [lambda i=i: task(i) for i in range(8)]
    assert run_each(tasks, 2) == [i * i for i in range(8)]
    helpers = {t for t in threads if t is not threading.current_thread()}
    assert len(helpers) == 1 and all(t.daemon for t in helpers)
    assert run_each(tasks[1:], 1) == [i * i for i in range(1, 8)]

    def boom() -> int:
        raise ValueError("kernel failed")

    with pytest.raises(ValueError, match="kernel failed"):
        run_each([boom, *tasks[1:]], 2)
