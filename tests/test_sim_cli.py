"""`prefixscan simulate` through typer's CliRunner: run dirs, --json contract, byte-identical tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.run import rundir
from prefixscan.sim import SimResult
from tests.sim_tables import conversations_table

runner = CliRunner()
HEADLINE = (
    "hit_rate_token_weighted",
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "imbalance_max_mean",
    "spill_rate",
    "prefill_tokens",
)


def make_run(path: Path, seed: int = 1) -> Path:
    p = rundir.prepare(path)
    rundir.write_table(p, "requests", conversations_table(60, 4, rate_rps=20, seed=seed))
    rundir.write_manifest(p, {"config": {"block_size": 16, "hit_rule": "vllm"}})
    return p


def test_json_contract_and_tables(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    res = runner.invoke(
        app,
        [
            "simulate",
            str(run),
            "--replicas",
            "3",
            "--policies",
            "all",
            "--kv-blocks",
            "300",
            "--json",
            "--quiet",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["policies"]) == 12
    for metrics in doc["policies"].values():
        assert all(k in metrics for k in HEADLINE)
    manifest = rundir.read_manifest(run)
    assert manifest["simulations"]["default"]["config"]["replicas"] == 3
    for t in ("sim_policies", "sim_replicas", "sim_decisions", "sim_timeline"):
        assert (run / "simulations" / "default@1" / f"{t}.parquet").exists()
    again = SimResult.load(run)
    assert set(again.policies) == set(doc["policies"])
    assert list(again.policies)[:2] == ["round_robin", "random"]  # the run's order, not alphabetical
    shown = runner.invoke(app, ["simulate", str(run), "--load"])
    assert shown.exit_code == 0 and "cost_based" in shown.stdout


def test_seeded_cli_runs_are_byte_identical(tmp_path: Path) -> None:
    runs = [make_run(tmp_path / f"run{i}") for i in range(2)]
    for run in runs:
        res = runner.invoke(
            app,
            [
                "simulate",
                str(run),
                "-n",
                "3",
                "-p",
                "random,cost_based,chwbl",
                "--kv-blocks",
                "200",
                "--seed",
                "5",
                "--quiet",
            ],
        )
        assert res.exit_code == 0, res.output
    for t in ("sim_policies", "sim_replicas", "sim_decisions", "sim_timeline"):
        a, b = (r / "simulations" / "default@1" / f"{t}.parquet" for r in runs)
        assert a.read_bytes() == b.read_bytes()


def test_table_output_and_scenarios(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    res = runner.invoke(
        app,
        [
            "simulate",
            str(run),
            "-n",
            "2",
            "-p",
            "round_robin,oracle",
            "--kv-blocks",
            "200",
            "--restart",
            "5:0",
            "--add-replica",
            "8",
            "--event-delay",
            "0.5",
            "--param",
            "oracle.kv_risk_s=2",
            "--prefill-model",
            "preble",
            "--no-save",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "round_robin" in res.stdout and "oracle*" in res.stdout and "delayed" in res.stdout
    assert not (run / "sim_policies.parquet").exists() and not (run / "simulations").exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--policies", "nope"], "unknown policy"),
        (["--param", "chwbl.zzz=1"], "no parameter"),
        (["--param", "chwbl"], "POLICY.NAME=VALUE"),
        (["--restart", "abc"], "TIME_S:REPLICA"),
        (["--kv-blocks", "lots"], "--kv-blocks"),
        (["--knowledge", "psychic"], "--knowledge"),
    ],
)
def test_usage_errors_are_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    run = make_run(tmp_path / "run")
    res = runner.invoke(app, ["simulate", str(run), "--kv-blocks", "100", *args, "--quiet"])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_missing_run_is_a_clear_error(tmp_path: Path) -> None:
    res = runner.invoke(app, ["simulate", str(tmp_path / "nothing"), "--quiet"])
    assert res.exit_code != 0
    assert "Traceback" not in res.output
