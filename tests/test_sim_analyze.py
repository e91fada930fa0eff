"""End to end with the real analysis: one unbounded replica reproduces `analyze`'s ideal-cache column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import prefixscan
from prefixscan.run.load import load_run
from prefixscan.sim import SimConfig, simulate

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"


@pytest.mark.parametrize("log", ["mooncake_small.jsonl", "chat.jsonl"])
def test_unbounded_single_replica_equals_analysis(tmp_path: Path, log: str) -> None:
    if not (SAMPLES / log).exists():
        pytest.skip(f"{log} not in sample_logs")
    prefixscan.analyze(str(SAMPLES / log), output=str(tmp_path / "run"), quiet=True)
    run = load_run(tmp_path / "run")
    req = run.table("requests")
    res = simulate(
        run, SimConfig(replicas=1, unbounded_kv=True, policies=("round_robin",), prefill_model="preble")
    )
    dec = res.tables["sim_decisions"].sort_by("seq")
    ideal = req.sort_by("seq")["cached_tokens"].to_numpy()
    assert np.array_equal(dec["actual_cached_tokens"].to_numpy(), ideal)
    # and without the column: the simulator's own ideal pass agrees with the analysis
    bare = req.drop_columns(["cached_tokens"])
    res2 = simulate(
        bare,
        SimConfig(replicas=1, unbounded_kv=True, policies=("round_robin",), prefill_model="preble"),
        block_size=run.manifest["config"]["block_size"],
        hit_rule=run.manifest["config"]["hit_rule"],
    )
    assert res2.policies["round_robin"]["capture_of_ideal"] == 1.0
    assert res2.info["ideal_hit_rate_token_weighted"] == pytest.approx(
        ideal.sum() / req["prompt_tokens"].to_numpy().sum()
    )
