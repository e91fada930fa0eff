"""CLI: every command has help text and docs; analyze's JSON interface; exit codes; python -m."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import COMMAND_MODULES, app
from tests.conftest import ROOT, write_jsonl

runner = CliRunner()


def test_root_help_lists_every_command() -> None:
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for name in COMMAND_MODULES:
        assert name.replace("_", "-") in r.stdout


@pytest.mark.parametrize("name", COMMAND_MODULES)
def test_every_command_has_help_and_docs(name) -> None:
    name = name.replace("_", "-")  # module record_events is the command record-events
    r = runner.invoke(app, [name, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage" in r.stdout and len(r.stdout) > 200
    cmd = next(c for c in app.registered_commands if (c.name or c.callback.__name__) == name)
    assert (cmd.callback.__doc__ or "").strip(), f"{name} has no docstring"
    docs = ROOT / "docs" / f"{name}.md"
    assert docs.exists() or name in (ROOT / "README.md").read_text(), f"no docs for {name}"


def test_analyze_json_is_the_stable_interface(chat_log, tmp_path) -> None:
    r = runner.invoke(app, ["analyze", str(chat_log), "--json", "-q", "-o", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert set(s["requests"]) >= {"read", "accepted", "rejected"}
    assert set(s["tokens"]) >= {"prompt", "cached"}
    assert set(s["hit_rate"]) >= {"token_weighted", "block_weighted", "request_mean", "steady_state_token_weighted"}
    assert set(s["by_tenant"]) == {"acme", "globex"}
    assert set(s["by_tenant"]["acme"]) >= {"requests", "token_weighted"}
    assert s["requests"]["read"] == s["requests"]["accepted"] + s["requests"]["rejected"] == 15
    assert (tmp_path / "run" / "manifest.json").exists()


def test_analyze_terminal_summary_names_the_definitions(chat_log) -> None:
    r = runner.invoke(app, ["analyze", str(chat_log)])
    assert r.exit_code == 0, r.output
    out = r.stdout
    for phrase in ("token-weighted", "block-weighted", "mean of per-request hit fractions", "records read 15 ="
                   , "Where reuse lives", "approximation of the engine"):
        assert phrase in out


def test_errors_are_one_line_with_exit_codes(tmp_path) -> None:
    r = runner.invoke(app, ["analyze", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 3 and r.stderr.startswith("prefixscan: error: input") and "Traceback" not in r.output
    p = write_jsonl(tmp_path / "a.jsonl", ["{bad"])
    r = runner.invoke(app, ["analyze", str(p), "--strict"])
    assert r.exit_code == 4 and "invalid_json" in r.stderr
    r = runner.invoke(app, ["analyze", str(p), "--field", "nonsense"])
    assert r.exit_code == 2


def test_python_dash_m_and_version() -> None:
    r = subprocess.run([sys.executable, "-m", "prefixscan", "--version"], capture_output=True, text=True,
                       check=True, cwd=ROOT)
    assert r.stdout.strip() == "0.1.0"


def test_console_script_ends_like_python_dash_m(tmp_path, chat_log) -> None:
    """The `prefixscan` command ends its process without the interpreter's teardown (`cli.app.console`):
    the same stdout, stderr, exit codes and run directory as `python -m prefixscan`, which exits normally."""
    from pathlib import Path

    script = Path(sys.executable).with_name("prefixscan")
    if not script.exists():
        pytest.skip("the console script is not installed beside this interpreter")
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{bad"])
    for args in (["--version"], ["analyze", str(tmp_path / "missing.jsonl")], ["analyze", str(bad), "--strict"],
                 ["analyze", str(chat_log), "--field", "nonsense"], ["analyze", str(chat_log), "-o", "RUN"]):
        runs = []
        a, b = tmp_path / "run_a", tmp_path / "run_b"
        for cmd, run in (([str(script)], a), ([sys.executable, "-m", "prefixscan"], b)):
            argv = [str(run) if a == "RUN" else a for a in args]
            r = subprocess.run([*cmd, *argv], capture_output=True, text=True, cwd=tmp_path)
            out, err = (x.replace(str(run), "RUN").replace("python -m prefixscan", "prefixscan")
                        for x in (r.stdout, r.stderr))
            runs.append((r.returncode, out, err))
        assert runs[0] == runs[1], args
    assert runs[0][0] == 0 and "hit rate" in runs[0][1]
    for name in ("requests", "misses", "prefixes"):
        assert (a / f"{name}.parquet").read_bytes() == (b / f"{name}.parquet").read_bytes()
    closed = subprocess.run(f"'{script}' analyze '{chat_log}' | head -c 1", shell=True, capture_output=True,
                            text=True, cwd=tmp_path)
    assert "Traceback" not in closed.stderr


def test_python_api_mirrors_the_commands(tmp_path, chat_log) -> None:
    """analyze -> simulate -> estimate -> write_report from Python, as the README shows."""
    import prefixscan

    run = str(tmp_path / "run")
    a = prefixscan.analyze(str(chat_log), output=run)
    s = prefixscan.simulate(run, replicas=2, policies=("round_robin", "session_affinity"), kv_blocks=4096)
    sim = s.to_json()["policies"]
    assert set(sim) == {"round_robin", "session_affinity"}
    assert sim["session_affinity"]["hit_rate_token_weighted"] >= sim["round_robin"]["hit_rate_token_weighted"]
    assert sim["session_affinity"]["hit_rate_token_weighted"] <= a.summary["hit_rate"]["token_weighted"] + 1e-12
    assert prefixscan.load_run(run).has("sim_policies")
    e = prefixscan.estimate(run, replicas=2).to_json()
    assert e["gpus"]["no_reuse"] >= e["gpus"]["ideal"] > 0
    paths = prefixscan.write_report(run)
    assert paths["md"].exists() and paths["html"].exists()
