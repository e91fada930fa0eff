"""Serving-time model: the Preble fit, the cost-model coefficients, user coefficients; empty input."""

from __future__ import annotations

import pyarrow as pa
import pytest

from prefixscan.sim import SimConfig, simulate
from prefixscan.sim.timing import ServingModel, from_coeffs, from_cost_model, kv_capacity_blocks, preble_fit
from tests.sim_tables import conversations_table


def test_preble_fit_reproduces_the_published_formula() -> None:
    pm = preble_fit()
    for new, cached in [(1000, 0), (500, 9500), (8000, 24000)]:
        ctx = new + cached
        ms = 28.93 + 0.182 * new + 0.004 * ctx + 2.55e-6 * new * ctx
        assert pm.seconds(new, cached) == pytest.approx(ms / 1000)
    assert pm.seconds(0, 5000) == 0.0  # nothing to compute


def test_cost_model_coefficients_equal_prefill_seconds() -> None:
    from prefixscan.hardware import flops, gpus, models

    pm = from_cost_model("llama-3.1-70b", "h100", "fp8", mfu=0.5, tensor_parallel=2)
    m, g = models.get_model("llama-3.1-70b"), gpus.get_gpu("h100")
    for new, cached in [(500, 10_000), (4096, 0), (1, 100_000)]:
        expect = flops.prefill_seconds(new, cached, m, g, "fp8", mfu=0.5, gpus=2)
        assert pm.seconds(new, cached) == pytest.approx(expect, rel=1e-9)


def test_kv_capacity_from_catalogue() -> None:
    from prefixscan.hardware import flops, gpus, models

    tokens = flops.kv_capacity_tokens(models.get_model("llama-3.1-8b"), gpus.get_gpu("h100"), 2.0, 1, 0.9)
    assert kv_capacity_blocks("llama-3.1-8b", "h100", "bf16", 16) == tokens // 16


def test_user_coefficients_and_budget_sharing() -> None:
    sm = ServingModel(from_coeffs((10.0, 0.1)), tpot_s=0.02, decode_slowdown=0.01, token_budget=1000)
    assert sm.prefill_s(1000, 0, 0) == pytest.approx(0.110)
    assert sm.prefill_s(1000, 0, 500) == pytest.approx(0.220)  # half the step budget goes to decodes
    assert sm.decode_s(11, 1) == pytest.approx(0.2)
    assert sm.decode_s(11, 11) == pytest.approx(0.2 * 1.1)


def test_empty_requests_table() -> None:
    empty = conversations_table(1, 1).slice(0, 0)
    res = simulate(empty, SimConfig(replicas=2, kv_blocks=10, prefill_model="preble"))
    for s in res.policies.values():
        assert s["requests"] == 0 and s["hit_rate_token_weighted"] is None and s["ttft_p50_s"] is None
    assert res.tables["sim_decisions"].num_rows == 0
    assert isinstance(res.tables["sim_policies"], pa.Table)
