"""The compiled replay (`sim/fast/`) against the Python reference engine: identical outcomes, every policy.

Workloads vary the shapes that stress different paths: multi-turn conversations over shared system
prompts, tenants, requests with no conversation or no full block, bursts of equal arrival times, tight
KV memory (evictions, head-of-line blocking, oversized requests), few sequences per replica, cached
generated blocks, no decode reservation, restarts / added / removed replicas, and every knowledge mode.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscan.sim import SimConfig, serving_model, simulate
from prefixscan.sim.config import ReplicaEvent
from prefixscan.sim.engine import replay
from prefixscan.sim.fast import replay_fast
from prefixscan.sim.outcome import Outcome, _capacity
from prefixscan.sim.policies import POLICIES, make_policy
from prefixscan.sim.workload import build_workload
from tests.sim_tables import WORKLOAD_SCHEMA, chain, conversations_table

ARRAYS = (
    "replica", "start_s", "first_token_s", "finish_s", "cached_tokens", "predicted_cached", "best_cached",
    "routed_cached", "routed_blocks", "prefill_s", "reason", "cand_ids", "cand_off", "evictions",
    "evict_age_sum", "evict_hist", "area_outstanding", "area_waiting",
)
SCALARS = ("policy", "n_slots", "reasons", "horizon_s", "oversized", "knowledge", "extra")
FAST = dict(prefill_model="preble", tpot_s=0.01)
# parameter sets that reach each policy's less common branches
VARIANTS: dict[str, list[dict[str, object]]] = {
    "least_loaded": [{"metric": "backlog"}],
    "chwbl": [{"key": "prefix", "c": 1.0}, {"c": 2.0, "vnodes": 7}],
    "prefix_hash": [{"hot_requests": 2, "replicas_k": 3, "window_s": 5.0}, {"hot_requests": 1, "replicas_k": 1}],
    "sglang_cache_aware": [
        {"knowledge": "exact", "balance_abs_threshold": 2, "balance_rel_threshold": 1.1},
        {"max_tree_size": 4000, "eviction_interval_s": 3.0, "cache_threshold": 0.6},
        {"knowledge": ""},
    ],
    "dynamo_kv": [{"router_temperature": 0.5}, {"overlap_score_weight": 0.0}, {"knowledge": "approximate"}],
    "llmd_weighted": [{"knowledge": "exact"}, {"lru_blocks": 200}, {"knowledge": ""}],
    "preble_e2": [{"window_s": 2.0}],
    "cost_based": [{"cold_pool": 1}, {"max_warm_wait_s": 0.01, "margin_rel": 0.0, "margin_abs_s": 0.0}],
    "oracle": [{"kv_risk_s": 0.0}],
}


def assert_same(a: Outcome, b: Outcome) -> None:
    for f in ARRAYS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, f
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f"{a.policy}: {f} differs"
    for f in SCALARS:
        assert getattr(a, f) == getattr(b, f), f"{a.policy}: {f} differs"
    assert candidates(a) == candidates(b)


def candidates(o: Outcome) -> list[tuple[int, ...]]:
    """Per-request candidate tuples (the decision log's `candidate_replicas`)."""
    ids, off = o.cand_ids.tolist(), o.cand_off.tolist()
    return [tuple(ids[off[i] : off[i + 1]]) for i in range(len(off) - 1)]


def both(table: pa.Table, name: str, cfg: SimConfig, params: dict[str, object] | None = None) -> Outcome:
    """Replay one policy with both engines, assert they agree, return the outcome."""
    w = build_workload(table, 16, isolate_tenants=cfg.isolate_tenants, warmup_s=cfg.warmup_s)
    serving = serving_model(cfg)
    cap = _capacity(cfg, w)
    ov = {k: str(v) for k, v in (params or {}).items()}
    ref = replay(w, make_policy(name, ov, cfg.seed), cfg, serving, cap)
    fast = replay_fast(w, make_policy(name, ov, cfg.seed), cfg, serving, cap)
    assert_same(ref, fast)
    return fast


def odd_table(seed: int, n: int = 150, burst: float = 0.5) -> pa.Table:
    """Random prefix-tree prompts, some without conversation or tenant, some shorter than a block,
    arrival times on a coarse grid so many requests arrive together."""
    rng = np.random.default_rng(seed)
    docs = [[1000 * d + j for j in range(int(rng.integers(1, 12)))] for d in range(6)]
    convs: dict[int, list[int]] = {}
    rows, nxt, t = [], 10**6, 0.0
    for i in range(n):
        t += float(rng.exponential(burst))
        c = int(rng.integers(-3, 25))  # < 0: no conversation
        if c >= 0 and c in convs and rng.random() < 0.8:
            contents = convs[c] + list(range(nxt, nxt + int(rng.integers(0, 4))))
        else:
            contents = list(docs[int(rng.integers(len(docs)))][: int(rng.integers(0, 12))])
            contents += list(range(nxt, nxt + int(rng.integers(0, 5))))
        nxt += 10
        if c >= 0:
            convs[c] = contents
        tail = int(rng.integers(0, 16))
        rows.append(
            {
                "seq": i,
                "request_id": f"r{i}",
                "arrival_s": round(t, 0),
                "tenant": None if rng.random() < 0.3 else f"t{int(rng.integers(3))}",
                "conversation_id": None if c < 0 else f"c{c}",
                "prompt_tokens": len(contents) * 16 + tail if contents else tail + 1,
                "output_tokens": int(rng.integers(1, 200)),
                "block_hashes": chain(contents),
            }
        )
    return pa.Table.from_pylist(rows, schema=WORKLOAD_SCHEMA)


def policy_cases() -> list[tuple[str, dict[str, object]]]:
    return [(p, {}) for p in POLICIES] + [(p, v) for p, vs in VARIANTS.items() for v in vs]


@pytest.fixture(scope="module")
def chats() -> pa.Table:
    return conversations_table(80, 5, rate_rps=40, think_s=1.0, system_prompts=3, tenants=3, seed=21)


@pytest.mark.parametrize("name,params", policy_cases(), ids=lambda x: str(x) if isinstance(x, str) else "")
@pytest.mark.parametrize("knowledge,delay", [("exact", 0.0), ("delayed", 1.5), ("approximate", 0.0)])
def test_every_policy_and_knowledge_mode(
    chats: pa.Table, name: str, params: dict[str, object], knowledge: str, delay: float
) -> None:
    cfg = SimConfig(
        replicas=4, kv_blocks=160, knowledge=knowledge, event_delay_s=delay, approx_ttl_s=6.0, seed=5, **FAST
    )
    both(chats, name, cfg, params)


@pytest.mark.parametrize("name", list(POLICIES))
def test_tight_memory_generated_blocks_and_scenarios(name: str) -> None:
    t = odd_table(7, 220)
    span = float(t["arrival_s"].to_numpy().max())
    events = (
        ReplicaEvent(span * 0.3, "restart", 0),
        ReplicaEvent(span * 0.4, "add"),
        ReplicaEvent(span * 0.5, "remove", 1),
        ReplicaEvent(span * 0.6, "restart", 3),
        ReplicaEvent(span * 0.7, "remove", 2),
        ReplicaEvent(span * 0.7, "add"),
    )
    for kw in (
        dict(kv_blocks=40, cache_generated=True, max_num_seqs=3),
        dict(kv_blocks=25, reserve_decode_blocks=False, knowledge="delayed", event_delay_s=2.0),
        dict(kv_blocks=60, events=events, cache_generated=True, knowledge="approximate", approx_ttl_s=3.0),
        dict(kv_blocks=60, events=events, knowledge="delayed", event_delay_s=1.0, max_num_seqs=2),
        dict(unbounded_kv=True, isolate_tenants=True, warmup_s=5.0),
    ):
        both(t, name, SimConfig(replicas=3, seed=11, **FAST, **kw))


def test_single_replica_and_removing_the_last_one() -> None:
    t = odd_table(3, 80)
    ev = (ReplicaEvent(10.0, "remove", 0), ReplicaEvent(20.0, "restart", 0))
    for name in POLICIES:
        both(t, name, SimConfig(replicas=1, kv_blocks=30, events=ev, **FAST))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    replicas=st.integers(1, 6),
    kv_blocks=st.integers(8, 400),
    max_seqs=st.integers(1, 8),
    knowledge=st.sampled_from(["exact", "delayed", "approximate"]),
    delay=st.sampled_from([0.0, 0.5, 3.0]),
    ttl=st.sampled_from([1.0, 10.0, 1e9]),
    gen=st.booleans(),
    reserve=st.booleans(),
    coeffs=st.sampled_from([(), (5.0, 0.1, 0.01, 1e-5, 1e-6), (0.0, 0.02)]),
    n_events=st.integers(0, 4),
)
def test_random_configs_agree(
    seed: int,
    replicas: int,
    kv_blocks: int,
    max_seqs: int,
    knowledge: str,
    delay: float,
    ttl: float,
    gen: bool,
    reserve: bool,
    coeffs: tuple[float, ...],
    n_events: int,
) -> None:
    rng = np.random.default_rng(seed)
    t = odd_table(seed, int(rng.integers(20, 120)), burst=float(rng.choice([0.05, 0.5, 3.0])))
    span = float(t["arrival_s"].to_numpy().max()) + 1.0
    actions = ["restart", "add", "remove"]
    events = tuple(
        ReplicaEvent(float(rng.uniform(0, span)), actions[int(rng.integers(3))], int(rng.integers(replicas)))
        for _ in range(n_events)
    )
    cfg = SimConfig(
        replicas=replicas,
        kv_blocks=kv_blocks,
        max_num_seqs=max_seqs,
        knowledge=knowledge,
        event_delay_s=delay,
        approx_ttl_s=ttl,
        cache_generated=gen,
        reserve_decode_blocks=reserve,
        events=events,
        seed=seed,
        tpot_s=float(rng.choice([0.001, 0.02])),
        **({"prefill_model": "coeffs", "prefill_coeffs": coeffs} if coeffs else {"prefill_model": "preble"}),
    )
    for name, params in policy_cases():
        both(t, name, cfg, params)


def test_simulate_tables_are_identical_with_either_engine(chats: pa.Table) -> None:
    cfg = SimConfig(replicas=3, kv_blocks=200, seed=3, compare_isolation=True, **FAST)
    fast = simulate(chats, cfg)
    ref = simulate(chats, cfg, engine="reference")
    assert set(fast.engines.values()) == {"fast"} and set(ref.engines.values()) == {"reference"}
    assert fast.dumps() == ref.dumps()
    assert fast.tables.keys() == ref.tables.keys()
    for name in fast.tables:
        assert fast.tables[name].equals(ref.tables[name]), name


def test_environment_variable_forces_the_reference(chats: pa.Table, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXSCAN_SIM_ENGINE", "reference")
    res = simulate(chats, SimConfig(replicas=2, kv_blocks=200, policies=("round_robin",), **FAST))
    assert res.engines == {"round_robin": "reference"}


def test_unsupported_parameters_fall_back_to_the_reference(chats: pa.Table) -> None:
    from prefixscan.errors import UsageError

    cfg = SimConfig(
        replicas=3, kv_blocks=200, policies=("chwbl",), policy_params=(("chwbl", "prefix_blocks", 0),), **FAST
    )
    res = simulate(chats, cfg)
    assert res.engines == {"chwbl": "reference"}
    with pytest.raises(UsageError, match="prefix_blocks"):
        simulate(chats, cfg, engine="fast")
    plain = dataclasses.replace(cfg, policy_params=())
    assert simulate(chats, plain, engine="fast").engines == {"chwbl": "fast"}


def test_empty_and_blockless_workloads(chats: pa.Table) -> None:
    for name in POLICIES:
        both(chats.slice(0, 0), name, SimConfig(replicas=2, kv_blocks=10, **FAST))
    short = odd_table(5, 30).set_column(
        7, "block_hashes", pa.array([[] for _ in range(30)], pa.list_(pa.uint64()))
    )  # every prompt shorter than one block
    for name in POLICIES:
        both(short, name, SimConfig(replicas=3, kv_blocks=10, knowledge="approximate", **FAST))


def test_one_registry_and_one_file_per_policy() -> None:
    """`POLICIES` is the only registry: each policy's module holds its reference class and its compiled form,
    whose `CODE` is its place in the registry (what `kernel.choose` branches on), and `sim/fast/` holds no
    policy of its own; a subclass of a built-in policy runs on the reference."""
    import sys
    from pathlib import Path

    from prefixscan.sim.fast import compiled_form, unsupported
    from prefixscan.sim.policies.round_robin import RoundRobin

    for code, (name, cls) in enumerate(POLICIES.items()):
        module = sys.modules[cls.__module__]
        assert cls.name == name and module.CODE == code
        assert callable(module.setup) and hasattr(module.kernel, "py_func")  # a numba dispatcher
        assert compiled_form(make_policy(name, {}, 0)) is module
    fast_dir = Path(sys.modules["prefixscan.sim.fast"].__file__).parent
    assert sorted(p.stem for p in fast_dir.rglob("*.py")) == ["__init__", "kernel", "layout", "shared", "views"]

    class Mine(RoundRobin):
        pass

    assert compiled_form(Mine(RoundRobin.Params(), 0)) is None
    assert unsupported(Mine(RoundRobin.Params(), 0)) == "Mine is not a built-in policy"
