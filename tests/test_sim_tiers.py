"""KV tiers below the GPU and disaggregated prefill/decode, against simple references.

- the LRU tier against a list scanned in full (hypothesis, random operation sequences);
- a zero-size tier equals no tier (every outcome array, against the compiled no-tier replay);
- an unbounded host tier equals an unbounded GPU (cached tokens per request: the union of GPU and host
  is every block the replica ever cached, and admission order is FCFS per replica);
- free, instant transfer and no decode cost: the prefill pool's cache results equal a co-located fleet
  of the same size, for every policy;
- load time of lower-tier blocks enters TTFT; the shared store serves other replicas once written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.errors import UsageError
from prefixscan.sim import SimConfig, SimResult, serving_model, simulate
from prefixscan.sim.engine import replay
from prefixscan.sim.fast import replay_fast
from prefixscan.sim.outcome import _capacity
from prefixscan.sim.policies import POLICIES, make_policy
from prefixscan.sim.tiers import LRUTier
from prefixscan.sim.timing import ServingModel, kv_bytes_per_token
from prefixscan.sim.workload import build_workload
from tests.oracles.tiers_ref import ReferenceLRU
from tests.sim_tables import WORKLOAD_SCHEMA, chain, conversations_table

BASE = dict(prefill_model="preble", tpot_s=0.01)
SAME = ("replica", "start_s", "first_token_s", "finish_s", "cached_tokens", "predicted_cached", "best_cached",
        "routed_cached", "prefill_s", "evictions", "area_outstanding", "area_waiting")


def _run(table: pa.Table, name: str, cfg: SimConfig, serving: ServingModel | None = None, fast: bool = False):
    w = build_workload(table, 16)
    serving = serving or serving_model(cfg)
    pol = make_policy(name, {}, cfg.seed)
    return w, (replay_fast if fast else replay)(w, pol, cfg, serving, _capacity(cfg, w))


@pytest.fixture(scope="module")
def chats() -> pa.Table:
    return conversations_table(40, 5, rate_rps=30, think_s=1.0, system_prompts=3, tenants=2, seed=5)


ops = st.lists(
    st.tuples(st.sampled_from(["put", "touch", "clear"]), st.lists(st.integers(0, 12), max_size=6)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, cap=st.one_of(st.none(), st.integers(0, 6)))
def test_lru_tier_matches_reference(ops: list[tuple[str, list[int]]], cap: int | None) -> None:
    fast, ref = LRUTier(cap), ReferenceLRU(cap)
    for op, ids in ops:
        if op == "clear":
            fast.clear()
            ref.clear()
        else:
            getattr(fast, op)(ids)
            getattr(ref, op)(ids)
        assert sorted(fast.lru) == sorted(b for _, b in ref.items)
        assert [b for b in fast.lru] == [b for _, b in sorted(ref.items)]  # same recency order
        assert fast.evictions == ref.evictions


@pytest.mark.parametrize("name", ["round_robin", "dynamo_kv", "cost_based", "sglang_cache_aware"])
def test_zero_size_tier_equals_no_tier(chats: pa.Table, name: str) -> None:
    plain = SimConfig(replicas=3, kv_blocks=120, **BASE)
    # sizes in GiB that round to zero blocks: the tier machinery runs, holding nothing
    zero = dataclasses.replace(plain, host_kv_gib=1e-9, shared_kv_gib=1e-9, router_sees_tiers=True)
    assert zero.tiered
    _, a = _run(chats, name, plain, fast=True)
    _, b = _run(chats, name, zero)
    for f in SAME:
        assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True), f
    assert b.tiers["host_tokens"].sum() == 0 and b.tiers["shared_tokens"].sum() == 0


@pytest.mark.parametrize("write", ["through", "back"])
@pytest.mark.parametrize("name,replicas", [("round_robin", 3), ("dynamo_kv", 1), ("cost_based", 1)])
def test_unbounded_host_tier_equals_unbounded_gpu(chats: pa.Table, write: str, name: str, replicas: int) -> None:
    # GPU small enough to evict a lot, big enough that no request is truncated
    gpu = SimConfig(replicas=replicas, kv_blocks=90, host_kv_blocks=-1, host_write=write, **BASE)
    unbounded = SimConfig(replicas=replicas, unbounded_kv=True, **BASE)
    w, t = _run(chats, name, gpu)
    _, u = _run(chats, name, unbounded, fast=True)
    assert t.evictions.sum() > 0 and t.tiers["host_tokens"].sum() > 0
    assert np.array_equal(t.replica, u.replica)
    assert np.array_equal(t.cached_tokens, u.cached_tokens)


def test_bounded_host_tier_is_between(chats: pa.Table) -> None:
    runs = [_run(chats, "round_robin", SimConfig(replicas=2, kv_blocks=90, host_kv_blocks=h, **BASE))[1]
            for h in (0, 60, 240, -1)]
    hits = [int(o.cached_tokens.sum()) for o in runs]
    assert hits == sorted(hits) and hits[0] < hits[-1]


class NoDecode(ServingModel):
    """Decoding costs nothing and never slows a prefill."""

    def prefill_s(self, new: float, cached: float, decoding: int) -> float:
        return self.prefill.seconds(new, cached)

    def decode_s(self, output_tokens: int, decoding: int) -> float:
        return 0.0


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_free_transfer_prefill_pool_equals_colocated(chats: pa.Table, name: str) -> None:
    colo = SimConfig(replicas=3, kv_blocks=120, reserve_decode_blocks=False, **BASE)
    pd = dataclasses.replace(colo, decode_replicas=4, decode_kv_blocks=100_000, pd_link="inf", pd_latency_s=0.0)
    serving = NoDecode(serving_model(colo).prefill)
    _, a = _run(chats, name, colo, serving)
    _, b = _run(chats, name, pd, serving)
    for f in ("replica", "start_s", "cached_tokens", "predicted_cached", "routed_cached", "prefill_s",
              "evictions", "area_outstanding"):
        assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True), f
    assert np.all(b.tiers["transfer_s"] == 0) and np.all(b.tiers["decode_wait_s"] == 0)


def test_disaggregated_ttft_includes_transfer_and_decode_queue(chats: pa.Table) -> None:
    cfg = SimConfig(replicas=2, kv_blocks=200, decode_replicas=1, decode_kv_blocks=300, max_num_seqs=4,
                    pd_link="rdma-200g", pd_latency_s=0.002, **BASE)
    w, o = _run(chats, "round_robin", cfg)
    t = o.tiers
    bpt = kv_bytes_per_token(cfg.model, cfg.dtype)
    assert np.allclose(t["transfer_s"], 0.002 + w.prompt_tokens * bpt / 25e9)
    assert np.allclose(o.first_token_s, t["prefill_done_s"] + t["decode_wait_s"] + t["transfer_s"])
    assert (t["decode_wait_s"] > 0).any()  # one small decode worker: requests queue for it
    assert np.all(o.first_token_s >= o.start_s + o.prefill_s)


def _two_requests(gap_s: float) -> pa.Table:
    """The same 20-block prompt twice, `gap_s` apart, with unrelated 20-block prompts in between."""
    rows = []
    for i, (t, c) in enumerate([(0.0, 1), (1.0, 2), (2.0, 3), (2.0 + gap_s, 1)]):
        rows.append({"seq": i, "request_id": f"r{i}", "arrival_s": t, "tenant": None, "conversation_id": None,
                     "prompt_tokens": 20 * 16 + 5, "output_tokens": 2,
                     "block_hashes": chain([c * 100 + j for j in range(20)])})
    return pa.Table.from_pylist(rows, schema=WORKLOAD_SCHEMA)


def test_host_hit_load_time_enters_ttft() -> None:
    cfg = SimConfig(replicas=1, kv_blocks=45, host_kv_blocks=1000, host_link="10", **BASE)
    w, o = _run(_two_requests(5.0), "round_robin", cfg)
    t = o.tiers
    # 44 usable GPU blocks: the third request evicted the first one's tail (17 blocks), the host kept it
    assert o.cached_tokens[3] == 320 and t["host_tokens"][3] == 17 * 16
    load = 17 * 16 * kv_bytes_per_token(cfg.model, cfg.dtype) / 10e9
    assert t["load_s"][3] == pytest.approx(load)
    pure = serving_model(cfg).prefill_s(5, 320, 0)
    assert o.prefill_s[3] == pytest.approx(load + pure)


@pytest.mark.parametrize("gap,hit", [(5.0, True), (0.0, False)])
def test_shared_store_serves_other_replicas_once_written(gap: float, hit: bool) -> None:
    # round robin over 3 replicas: request 3 lands on replica 0 again, so use 2 replicas: r0, r1, r0, r1
    cfg = SimConfig(replicas=2, kv_blocks=200, shared_kv_blocks=-1, shared_write="0.01", **BASE)
    table = _two_requests(gap)
    w, o = _run(table, "round_robin", cfg)
    assert o.replica.tolist() == [0, 1, 0, 1]
    assert bool(o.tiers["shared_tokens"][3] == 320) is hit  # the write of 42 MB takes 4.2 s


def test_router_sees_tiers_predicts_tier_hits() -> None:
    base = SimConfig(replicas=1, kv_blocks=45, host_kv_blocks=1000, **BASE)
    _, blind = _run(_two_requests(5.0), "dynamo_kv", base)
    _, seeing = _run(_two_requests(5.0), "dynamo_kv", dataclasses.replace(base, router_sees_tiers=True))
    assert blind.routed_cached[3] == 48 and seeing.routed_cached[3] == 320  # 3 blocks left on the GPU
    assert np.array_equal(blind.cached_tokens, seeing.cached_tokens)
    with pytest.raises(UsageError):
        dataclasses.replace(base, router_sees_tiers=True, knowledge="approximate")


def test_simulate_reports_tiers_and_colocated_comparison(chats: pa.Table) -> None:
    cfg = SimConfig(replicas=2, kv_blocks=120, host_kv_blocks=200, decode_replicas=1,
                    policies=("round_robin", "dynamo_kv"), **BASE)
    r = simulate(chats, cfg)
    for name, s in r.policies.items():
        assert r.engines[name] == "reference"
        assert s["cached_gpu_tokens"] + s["cached_host_tokens"] + s["cached_shared_tokens"] == s["cached_tokens"]
        assert s["recomputed_tokens"] == s["prompt_tokens"] - s["cached_tokens"]
        assert s["colocated_replicas"] == 3 and s["colocated_hit_rate_token_weighted"] is not None
        assert 0 < s["prefill_pool_utilization"] < 1 and s["prefill_gpus_needed"] >= 1
    d = r.tables["sim_decisions"]
    tot = pa.compute.add(pa.compute.add(d["cached_gpu_tokens"], d["cached_host_tokens"]), d["cached_shared_tokens"])
    assert tot.equals(d["actual_cached_tokens"])
    assert "decode_queue_wait_s" in d.column_names and "kv_transfer_s" in d.column_names


def test_plain_config_keeps_manifest_keys() -> None:
    assert "host_kv_blocks" not in SimConfig().to_dict()
    assert SimConfig(decode_replicas=2).to_dict()["decode_replicas"] == 2
    with pytest.raises(UsageError):
        SimConfig(router_sees_tiers=True)
    with pytest.raises(UsageError):
        SimConfig(host_link="warp-drive")


def test_cli_tiers_pd_and_sweep(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prefixscan.cli.app import app
    from prefixscan.run import rundir

    run = rundir.prepare(tmp_path / "run")
    rundir.write_table(run, "requests", conversations_table(30, 4, rate_rps=20, seed=3))
    rundir.write_manifest(run, {"config": {"block_size": 16, "hit_rule": "vllm"}})
    args = ["simulate", str(run), "-p", "round_robin,dynamo_kv", "--kv-blocks", "80", "--host-kv-blocks", "160",
            "--shared-kv-blocks", "unbounded", "--router-sees-tiers", "--prefill-replicas", "2",
            "--decode-replicas", "1", "--tier-sweep"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "Cached tokens by KV tier" in res.output and "co-located" in res.output and "Capacity view" in res.output
    loaded = SimResult.load(run)
    assert loaded.config["host_kv_blocks"] == 160
    assert loaded.config["decode_replicas"] == 1 and loaded.config["replicas"] == 2
    grid = loaded.tables["sim_tier_capacity"]
    assert grid.num_rows == 20 and set(grid["second_tier"].to_pylist()) == {"host"}
    zero = [r for r in grid.to_pylist() if r["second_tier_blocks"] == 0]
    assert all(r["hit_rate_host"] == 0 for r in zero)
    bad = CliRunner().invoke(app, ["simulate", str(run), "--host-link", "warp", "--host-kv-blocks", "5"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    bad = CliRunner().invoke(app, ["simulate", str(run), "--prefill-replicas", "2"])
    assert bad.exit_code != 0 and "--decode-replicas" in bad.output


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), gpu=st.integers(30, 120), host=st.integers(-1, 150),
       shared=st.integers(-1, 300), write=st.sampled_from(["through", "back"]),
       name=st.sampled_from(["round_robin", "dynamo_kv", "cost_based"]))
def test_replay_with_reference_tiers_is_identical(
    seed: int, gpu: int, host: int, shared: int, write: str, name: str
) -> None:
    """The whole tiered replay with the slow list-scan tiers equals the one with the O(1) LRU tiers."""
    import prefixscan.sim.tiers as tiers

    table = conversations_table(15, 4, rate_rps=30, think_s=1.0, system_prompts=2, seed=seed)
    if host == 0 and shared == 0:
        host = 40
    cfg = SimConfig(replicas=2, kv_blocks=gpu, host_kv_blocks=host, shared_kv_blocks=shared, host_write=write,
                    shared_write="5", cache_generated=seed % 2 == 0, router_sees_tiers=seed % 3 == 0, **BASE)
    _, a = _run(table, name, cfg)
    fast = tiers.LRUTier
    try:
        tiers.LRUTier = ReferenceLRU
        _, b = _run(table, name, cfg)
    finally:
        tiers.LRUTier = fast
    for f in SAME:
        assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True), f
    for k in ("host_tokens", "shared_tokens", "load_s", "host_evictions", "shared_evictions"):
        assert np.array_equal(a.tiers[k], b.tiers[k]), k


def test_plain_replay_has_no_tier_keys_or_columns(chats: pa.Table) -> None:
    r = simulate(chats, SimConfig(replicas=2, kv_blocks=120, policies=("round_robin",), **BASE))
    s = r.policies["round_robin"]
    assert not {"hit_rate_gpu", "decode_replicas", "colocated_replicas"} & set(s)
    assert "cached_gpu_tokens" not in r.tables["sim_decisions"].column_names
    assert "sim_tier_capacity" not in r.tables and r.engines["round_robin"] == "fast"
