"""`prefixscan estimate` through typer's CliRunner, plus import hygiene and an end-to-end subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from prefixscan.cli import estimate as estimate_cli

WORKED = ["estimate", "--model", "llama-3.1-70b", "--dtype", "fp8", "--gpu", "h100", "--replicas", "32",
          "--rps", "200", "--context-tokens", "10000", "--new-tokens", "500", "--hit-rate", "0.85",
          "--usd-per-gpu-hour", "2.5", "--linear"]


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    """The estimate command on its own app, so these tests do not depend on other commands importing."""
    a = typer.Typer(pretty_exceptions_enable=False)

    @a.callback()
    def _root() -> None:
        """prefixscan"""

    estimate_cli.register(a)
    return a


def run(app, args):
    return CliRunner().invoke(app, args, terminal_width=120)


def test_worked_example_json(app):
    res = run(app, [*WORKED, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert round(d["gpus"]["no_reuse"], 1) == 285.4
    assert round(d["gpus"]["round_robin"], 1) == 276.9
    assert round(d["gpus"]["prefix_aware"], 1) == 54.9
    assert round(d["gpus"]["ideal"], 1) == 14.3
    assert round(d["monthly_savings_usd"], -2) == 405_100
    assert round(d["ttft_s"]["miss"], 2) == 1.46 and round(d["ttft_s"]["hit"], 2) == 0.10
    assert d["verdict"]["router"].startswith("SGLang")


def test_worked_example_text(app):
    res = run(app, WORKED)
    assert res.exit_code == 0, res.output
    out = res.stdout
    for expected in ("285.4", "276.9", "54.9", "$405k per month", "hit 0.10 s, miss 1.46 s",
                     "7,007 prefill tok/s", "Sensitivity", "Verdict", "SGLang"):
        assert expected in out, expected


WORKED_TABLE = """\
┏━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━┓
┃ routing      ┃ requests with a hit ┃ prompt tokens cached ┃ of ideal ┃ prefill tok/s ┃  GPUs ┃ $/month ┃ basis    ┃
┡━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━┩
│ no reuse     │                0.0% │                 0.0% │     0.0% │     2,000,000 │ 285.4 │   $521k │ model    │
│ round robin  │                3.1% │                 3.0% │     3.1% │     1,940,625 │ 276.9 │   $505k │ analytic │
│ prefix-aware │               85.0% │                80.8% │    85.0% │       385,000 │  54.9 │   $100k │ flags    │
│ ideal cache  │              100.0% │                95.0% │   100.0% │       100,000 │  14.3 │    $26k │ model    │
└──────────────┴─────────────────────┴──────────────────────┴──────────┴───────────────┴───────┴─────────┴──────────┘
"""


def test_worked_example_exact_table_and_scenario(app):
    """The flags-only mode is analytic and says so; its table is byte-stable."""
    out = run(app, WORKED).stdout
    flat = " ".join(out.split())  # rich wraps long lines at the console width
    assert flat.startswith("Scenario: 32 replicas of llama-3.1-70b (fp8, TP2) on h100-sxm, 447,998 KV tokens per "
                           "replica, 200 req/s (--rps), $2.50/GPU-hour ")
    assert WORKED_TABLE in out
    assert "Round robin and router from: analytic (no run to replay: round robin is a 1/32 hit chance" in flat


def test_unknown_model_is_a_usage_error(app):
    res = run(app, [*WORKED, "--model", "gpt-5"])
    assert res.exit_code == 2
    assert "unknown model 'gpt-5'" in res.output and "llama-3.1-70b" in res.output
    assert "Traceback" not in res.output


def test_unknown_gpu_is_a_usage_error(app):
    res = run(app, [*WORKED, "--gpu", "tpu"])
    assert res.exit_code == 2 and "h100-sxm" in res.output


@pytest.mark.parametrize("flag,value,message", [("--rps", "-5", "--rps must be > 0"),
                                                ("--replicas", "0", "--replicas must be > 0"),
                                                ("--params", "lots", "cannot read 'lots'"),
                                                ("--params", "0", "--params must be > 0"),
                                                ("--mfu", "0", "--mfu must be in (0, 1]")])
def test_bad_values_have_clear_messages(app, flag, value, message):
    res = run(app, [*WORKED, flag, value])
    assert res.exit_code == 2
    assert message in res.output


def test_params_suffix_override(app):
    res = run(app, [*WORKED, "--params", "35.3B", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["gpus"]["no_reuse"] == pytest.approx(285.41 / 2, rel=1e-3)


def test_model_config_flag(app, tmp_path):
    cfg = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "vocab_size": 128256}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    res = run(app, [*WORKED, "--model-config", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["kv_bytes_per_token"] == 64 * 1024  # 128 KiB in BF16, 64 KiB in FP8


def test_flags_only_requires_workload(app):
    res = run(app, ["estimate", "--replicas", "8", "--hit-rate", "0.5"])
    assert res.exit_code == 2 and "--rps" in res.output and "--context-tokens" in res.output


def test_missing_run_directory(app, tmp_path):
    res = run(app, ["estimate", str(tmp_path / "nope"), "--replicas", "4"])
    assert res.exit_code == 5 and "not a prefixscan run directory" in res.output


def test_help_text(app):
    res = run(app, ["estimate", "--help"])
    assert res.exit_code == 0
    assert "prefix-aware" in res.stdout and "--hit-rate" in res.stdout


def test_cli_module_imports_no_heavy_libraries():
    code = ("import sys, prefixscan.cli.estimate; "
            "heavy = ('polars', 'duckdb', 'transformers', 'numba', 'pyarrow'); "
            "bad = [m for m in heavy if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_end_to_end_subprocess():
    """The real console entry point, when the rest of the app imports (other commands may be mid-edit)."""
    probe = subprocess.run([sys.executable, "-c", "import prefixscan.cli.app"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("prefixscan.cli.app does not import yet (another command module is missing)")
    cmd = [sys.executable, "-m", "prefixscan", *WORKED, "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert round(json.loads(res.stdout)["gpus"]["prefix_aware"], 1) == 54.9


def test_run_with_simulation_is_priced_with_the_simulated_model(tmp_path) -> None:
    """Without --model, estimate uses the model the run was simulated with, so it agrees with report."""
    import prefixscan
    from tests.conftest import chat, write_jsonl

    log = write_jsonl(tmp_path / "log.jsonl", [chat(i, f"c{i % 3}", 1 + i // 3) for i in range(9)])
    run = tmp_path / "run"
    prefixscan.analyze(str(log), output=str(run))
    from prefixscan.cli.app import app as main_app

    r = CliRunner().invoke(main_app, ["simulate", str(run), "-n", "2", "-p", "round_robin", "--model", "qwen2.5-7b",
                                      "-q"])
    assert r.exit_code == 0, r.output
    est = prefixscan.estimate(str(run), replicas=2)
    assert "qwen" in est.to_json()["model"]["name"].lower()
    est70 = prefixscan.estimate(str(run), replicas=2, model="llama-3.1-70b")
    assert "70b" in est70.to_json()["model"]["name"].lower()
