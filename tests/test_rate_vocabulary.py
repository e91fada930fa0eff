"""Issue 27: one rate vocabulary across commands. `--rps` is the traffic rate everywhere (`--rate-scale`
multiplies a log's own arrivals); the old names work but are hidden; every hint names an option that exists,
on the command it names."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from prefixscan.cli.app import app
from tests.test_estimate_replay import make_run

ROOT = Path(__file__).resolve().parents[1] / "prefixscan"
# Flags of other programs that messages quote (engines' own options), and `--help`.
FOREIGN = {"--help", "--no-kv-events", "--hicache-ratio", "--hicache-write-policy", "--enable-prefix-caching"}
OLD_NAMES = {"estimate": "--scale-to-rps", "report": "--scale-to-rps", "simulate": "--target-rps"}


def _options() -> tuple[dict[str, set[str]], set[str]]:
    cmd = typer.main.get_command(app)
    per = {name: {o for p in c.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
           for name, c in cmd.commands.items()}
    root = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    return per, root


def _messages() -> list[tuple[str, int, str]]:
    """Every string constant in the package that is not a docstring: (file, line, text)."""
    out = []
    for f in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(f.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        out += [(str(f.relative_to(ROOT.parent)), n.lineno, n.value) for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]
    return out


def test_every_option_a_message_names_exists():
    per, root = _options()
    known = set().union(*per.values()) | root | FOREIGN
    bad = [(f, line, m.group(0)) for f, line, text in _messages()
           for m in re.finditer(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9](?![\w-])", text) if m.group(0) not in known]
    assert not bad, bad


HINT_TO = re.compile(r"(--[a-z][a-z0-9-]*)[^`.;]{0,40}? to `(?:prefixscan )?([a-z-]+)")
HINT_CMD = re.compile(r"`prefixscan ([a-z-]+)([^`]*)`")


def test_every_hint_names_an_option_of_the_command_it_names():
    """"pass --rps to `simulate`" and "`prefixscan report RUN --rps R`": the option exists on that command."""
    per, root = _options()
    bad = []
    for f, line, text in _messages():
        pairs = [(m.group(1), m.group(2)) for m in HINT_TO.finditer(text)]
        pairs += [(o, m.group(1)) for m in HINT_CMD.finditer(text) for o in re.findall(r"--[a-z][a-z0-9-]*",
                                                                                         m.group(2))]
        bad += [(f, line, cmd, opt) for opt, cmd in pairs if cmd in per and opt not in per[cmd] | root | {"--help"}]
    assert not bad, bad


def test_the_analyze_hint_about_a_missing_clock_names_a_real_option():
    from prefixscan.pipeline.summary import input_notes

    per, _ = _options()
    text = " ".join(input_notes(type("Ing", (), {"input_ordered": 3, "prompt_check": type(
        "P", (), {"compared": 0, "differ": 0})()})(), 3))
    assert "pass --rps to `simulate`" in text and "--rps" in per["simulate"]


def test_one_name_per_rate_idea():
    per, _ = _options()
    for cmd in ("simulate", "estimate", "report", "diff"):
        assert "--rps" in per[cmd], cmd
    assert "--rate-scale" in per["simulate"]
    cmd = typer.main.get_command(app)
    for name, old in OLD_NAMES.items():
        visible = {o for p in cmd.commands[name].params if not getattr(p, "hidden", False) for o in p.opts}
        assert "--rps" in visible and old not in visible


@pytest.mark.parametrize("command", sorted(OLD_NAMES))
def test_old_names_are_hidden_from_help(command):
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "--rps" in res.output and OLD_NAMES[command] not in res.output


def _estimate_json(*rate: str) -> dict:
    args = ["estimate", "--model", "llama-3.1-8b", "--replicas", "8", "--context-tokens", "2000",
            "--new-tokens", "200", "--hit-rate", "0.6", "--json", "--no-save", *rate]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_old_estimate_name_still_works():
    new, old = _estimate_json("--rps", "40"), _estimate_json("--scale-to-rps", "40")
    assert new == old and new["workload"]["rps"] == 40
    assert new["scenario"]["sources"]["rps"] == "flag"


def test_old_and_new_names_that_disagree_are_a_usage_error():
    res = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--replicas", "8", "--context-tokens",
                                   "2000", "--new-tokens", "200", "--hit-rate", "0.6", "--rps", "40",
                                   "--scale-to-rps", "50"])
    assert res.exit_code == 2 and "--rps 40 and --scale-to-rps 50 (its old name) disagree" in res.output


def test_old_simulate_name_still_works(tmp_path):
    run = make_run(tmp_path, n=60, convs=10)
    out = {}
    for flag in ("--rps", "--target-rps"):
        res = CliRunner().invoke(app, ["simulate", str(run), "--replicas", "2", "-p", "round_robin",
                                       flag, "20", "--json", "--kv-blocks", "400", "--name", flag.strip("-")])
        assert res.exit_code == 0, res.output
        out[flag] = json.loads(res.stdout)
    assert out["--rps"]["config"]["target_rps"] == out["--target-rps"]["config"]["target_rps"] == 20
    assert out["--rps"]["policies"] == out["--target-rps"]["policies"]


def test_old_report_name_still_works(tmp_path):
    run = make_run(tmp_path)
    res = CliRunner().invoke(app, ["report", str(run), "--replicas", "4", "--scale-to-rps", "25", "-f", "md", "-q"])
    assert res.exit_code == 0, res.output
    md = (run / "report.md").read_text()
    assert "25 req/s (--rps)" in md and "| rate | 25 req/s | flag |" in md


def test_a_typed_old_name_wins_over_the_new_name_from_prefixscan_toml(tmp_path):
    """[scenario] rps = 50 now reaches simulate too; a script that types an old name keeps its rate."""
    cfg = tmp_path / "prefixscan.toml"
    cfg.write_text("[scenario]\nrps = 50\n")
    base = ["--config", str(cfg), "estimate", "--model", "llama-3.1-8b", "--replicas", "8", "--context-tokens",
            "2000", "--new-tokens", "200", "--hit-rate", "0.6", "--json", "--no-save"]
    doc = json.loads(CliRunner().invoke(app, [*base, "--scale-to-rps", "60"]).stdout)
    assert doc["workload"]["rps"] == 60 and doc["scenario"]["sources"]["rps"] == "flag"
    doc = json.loads(CliRunner().invoke(app, base).stdout)
    assert doc["workload"]["rps"] == 50 and doc["scenario"]["sources"]["rps"] == "prefixscan.toml"
    run = make_run(tmp_path, n=60, convs=10)
    sim = ["--config", str(cfg), "simulate", str(run), "--replicas", "2", "-p", "round_robin", "--json",
           "--kv-blocks", "400", "--no-decision-log"]
    res = CliRunner().invoke(app, [*sim, "--target-rps", "20"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["config"]["target_rps"] == 20
    res = CliRunner().invoke(app, sim)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["config"]["target_rps"] == 50
