"""Every canned query in queries/ runs on a sample run and returns the expected shape of answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from prefixscan.query import run_query
from tests.conftest import ROOT, chat, write_jsonl

QUERIES = sorted((ROOT / "queries").glob("*.sql"))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("q")
    recs = [chat(i, f"c{i % 4}", 1 + i // 4, tenant=["a", "b"][i % 2],
                 **({"cached_tokens": 0} if i % 3 == 0 else {})) for i in range(12)]
    recs.append("{broken")
    log = write_jsonl(d / "log.jsonl", recs)
    prefixscan.analyze(str(log), output=str(d / "run"))
    return str(d / "run")


def test_at_least_six_canned_queries() -> None:
    assert len(QUERIES) >= 6


def test_a_checkout_reads_the_top_level_queries_folder() -> None:
    """The design card's layout: queries/ at the top; a checkout (or editable install) reads it in place."""
    from prefixscan.query import canned_queries, queries_dir
    assert Path(str(queries_dir())) == ROOT / "queries"
    assert sorted(canned_queries()) == [q.stem for q in QUERIES]


def test_missing_canned_queries_are_an_environment_error(tmp_path, monkeypatch) -> None:
    """Neither the packaged copy nor a checkout's folder: one EnvError naming both places (exit 7)."""
    import prefixscan.query as query
    from prefixscan.errors import EnvError
    monkeypatch.setattr(query.resources, "files", lambda _pkg: tmp_path / "site" / "prefixscan")
    monkeypatch.setattr(query, "__file__", str(tmp_path / "src" / "prefixscan" / "query.py"))
    with pytest.raises(EnvError, match=r"prefixscan/queries/ \(installed\) nor queries/ \(checkout\)"):
        query.canned_queries()


@pytest.mark.parametrize("path", QUERIES, ids=[p.stem for p in QUERIES])
def test_canned_query_runs(run, path) -> None:
    cols, rows = run_query(run, f"@{path}")
    assert cols
    assert rows, f"{path.name} returned no rows on the sample run"


def test_hit_rate_by_tenant_matches_summary(run) -> None:
    cols, rows = run_query(run, "@hit_rate_by_tenant")
    total = sum(r[cols.index("cached_tokens")] for r in rows)
    s = prefixscan.load_run(run).manifest["analyze"]
    assert total == round(s["hit_rate"]["token_weighted"] * sum(r[cols.index("prompt_tokens")] for r in rows))


def test_query_cli_formats_and_errors(run, tmp_path) -> None:
    r = CliRunner().invoke(app, ["query", run, "select count(*) as n from requests", "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == [{"n": 12}]
    r = CliRunner().invoke(app, ["query", run, "select reason from rejects", "--format", "csv"])
    assert r.stdout.splitlines() == ["reason", "invalid_json"]
    out = tmp_path / "x.parquet"
    r = CliRunner().invoke(app, ["query", run, "select * from summaries", "--format", "parquet", "-o", str(out)])
    assert r.exit_code == 0 and out.exists()
    r = CliRunner().invoke(app, ["query", run, "select * from nope"])
    assert r.exit_code == 2 and "query failed" in r.stderr
    r = CliRunner().invoke(app, ["query", str(tmp_path), "select 1"])
    assert r.exit_code == 5 and "not a prefixscan run directory" in r.stderr
