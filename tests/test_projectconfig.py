"""prefixscan.toml: settings found beside the logs, recorded in the run, overridden by flags, typos refused."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from tests.conftest import ROOT

runner = CliRunner()


@pytest.fixture
def project(tmp_path):
    shutil.copy(ROOT / "sample_logs" / "chat.jsonl", tmp_path / "chat.jsonl")
    (tmp_path / "prefixscan.toml").write_text(
        '[analyze]\nblock_size = 32\nno_findings = true\nfield = { tenant = "tenant" }\n\n'
        '[scenario]\nreplicas = 3\nmodel = "llama-3.1-8b"\n\n[simulate]\npolicies = ["round_robin", "prefix_hash"]\n')
    return tmp_path


def manifest(run) -> dict:
    return json.loads((run / "manifest.json").read_text())


def test_config_beside_the_logs_is_applied_and_recorded(project) -> None:
    run = project / "run"
    r = runner.invoke(app, ["analyze", str(project / "chat.jsonl"), "-o", str(run)])
    assert r.exit_code == 0, r.output
    m = manifest(run)
    assert m["config"]["block_size"] == 32 and m["config"]["findings"] is False
    assert m["config"]["fields"] == {"tenant": "tenant"}
    assert m["project_config"]["sections"]["scenario"]["replicas"] == 3
    assert "settings from " in r.output and "block_size=32" in r.output
    # simulate on the run finds the recorded scenario and its own table
    s = runner.invoke(app, ["simulate", str(run), "-q", "--json"])
    assert s.exit_code == 0, s.output
    out = json.loads(s.stdout)
    assert sorted(out["policies"]) == ["prefix_hash", "round_robin"]
    assert out["config"]["replicas"] == 3 and out["config"]["model"] == "llama-3.1-8b"


def test_flags_win_over_the_file(project) -> None:
    run = project / "run"
    r = runner.invoke(app, ["analyze", str(project / "chat.jsonl"), "-o", str(run), "--block-size", "16", "-q"])
    assert r.exit_code == 0, r.output
    assert manifest(run)["config"]["block_size"] == 16 and manifest(run)["config"]["findings"] is False


def test_explicit_config_and_typos(project, tmp_path_factory) -> None:
    other = tmp_path_factory.mktemp("o") / "x.toml"
    other.write_text("[analyze]\nblock_sise = 32\n")
    r = runner.invoke(app, ["--config", str(other), "analyze", str(project / "chat.jsonl")])
    assert r.exit_code == 2 and "[analyze] has unknown key(s) block_sise" in r.output
    other.write_text("[scenario]\nreplica = 3\n")
    r = runner.invoke(app, ["--config", str(other), "estimate", "--json"])
    assert r.exit_code == 2 and "[scenario] has unknown key(s) replica" in r.output
    other.write_text("[analyse]\n")
    r = runner.invoke(app, ["--config", str(other), "analyze", str(project / "chat.jsonl")])
    assert r.exit_code == 2 and "unknown table(s) analyse" in r.output
    other.write_text("[analyze\n")
    r = runner.invoke(app, ["--config", str(other), "analyze", str(project / "chat.jsonl")])
    assert r.exit_code == 2 and "is not valid TOML" in r.output
    r = runner.invoke(app, ["--config", str(project / "missing.toml"), "analyze", str(project / "chat.jsonl")])
    assert r.exit_code == 2 and "does not exist" in r.output
