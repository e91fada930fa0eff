"""`batch_prefills`: a prefill step admits every queue head that fits (vLLM's scheduler), in both engines.

Checked: the compiled replay equals the Python reference with batching on, for every policy, under tight
memory, few sequences, a small token budget and scenario events; with one sequence per replica batching is
the serial replay; batched steps pay the fixed prefill term once (a hand-computed two-request step).
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscan.sim import SimConfig, simulate
from prefixscan.sim.config import ReplicaEvent
from prefixscan.sim.policies import POLICIES
from tests.sim_tables import WORKLOAD_SCHEMA, chain
from tests.test_sim_fast import FAST, both, odd_table, policy_cases


@pytest.mark.parametrize("name", list(POLICIES))
def test_fast_equals_reference_with_batched_prefills(name: str) -> None:
    t = odd_table(5, 200, burst=0.05)
    span = float(t["arrival_s"].to_numpy().max())
    events = (ReplicaEvent(span * 0.3, "restart", 0), ReplicaEvent(span * 0.5, "add"),
              ReplicaEvent(span * 0.6, "remove", 1))
    for kw in (
        dict(kv_blocks=40, max_num_seqs=4, token_budget=300),
        dict(kv_blocks=60, max_num_seqs=8, cache_generated=True, events=events),
        dict(kv_blocks=30, reserve_decode_blocks=False, knowledge="delayed", event_delay_s=1.0, max_num_seqs=3),
    ):
        both(t, name, SimConfig(replicas=3, seed=2, batch_prefills=True, **FAST, **kw))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), kv=st.integers(12, 200), seqs=st.integers(1, 9), budget=st.integers(64, 4096),
       gen=st.booleans())
def test_random_batched_configs_agree(seed: int, kv: int, seqs: int, budget: int, gen: bool) -> None:
    t = odd_table(seed, 60, burst=0.05)
    cfg = SimConfig(replicas=2, kv_blocks=kv, max_num_seqs=seqs, token_budget=max(budget, seqs + 1),
                    cache_generated=gen, batch_prefills=True, seed=seed, **FAST)
    for name, params in policy_cases()[:6]:
        both(t, name, cfg, params)


def test_one_sequence_batches_nothing() -> None:
    t = odd_table(3, 120, burst=0.05)
    cfg = SimConfig(replicas=2, kv_blocks=50, max_num_seqs=1, policies=("round_robin",), **FAST)
    a = simulate(t, cfg).tables["sim_decisions"]
    b = simulate(t, dataclasses.replace(cfg, batch_prefills=True)).tables["sim_decisions"]
    assert a.equals(b)


def test_a_batched_step_pays_the_fixed_term_once() -> None:
    """x at 0, then y and z during x's prefill: serially each pays a = 100 ms; batched, y and z share one
    step of a + 2 x 64 x 1 ms and get their first token together."""
    t = pa.table({"seq": [0, 1, 2], "request_id": ["x", "y", "z"], "arrival_s": [0.0, 0.01, 0.01],
                  "tenant": [None] * 3, "conversation_id": [None] * 3, "prompt_tokens": [64, 64, 64],
                  "output_tokens": [1, 1, 1], "block_hashes": [chain([1, 2, 3, 4]), chain([9, 8, 7, 6]),
                                                              chain([5, 5, 5, 5])]}, schema=WORKLOAD_SCHEMA)
    base = dict(replicas=1, policies=("round_robin",), kv_blocks=100, prefill_model="coeffs",
                prefill_coeffs=(100.0, 1.0), max_num_seqs=4)
    for engine in ("fast", "reference"):
        serial = simulate(t, SimConfig(**base), block_size=16, engine=engine).tables["sim_decisions"]
        batched = simulate(t, SimConfig(**base, batch_prefills=True), block_size=16,
                           engine=engine).tables["sim_decisions"]
        assert serial["ttft_s"].to_pylist() == pytest.approx([0.164, 0.318, 0.482])
        assert batched["ttft_s"].to_pylist() == pytest.approx([0.164, 0.382, 0.382])
        assert batched["prefill_s"].to_pylist() == pytest.approx([0.164, 0.228, 0.228])
