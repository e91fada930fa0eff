"""`prefixscan query` is read-only and sandboxed: only the run's tables, no files, no network, no writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from prefixscan.query import canned_queries, run_query
from tests.conftest import chat, write_jsonl

runner = CliRunner()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sandbox")
    log = write_jsonl(d / "log.jsonl", [chat(i, f"c{i % 3}", 1 + i // 3) for i in range(9)])
    prefixscan.analyze(str(log), output=str(d / "run"))
    return d / "run"


def _query(run: Path, sql: str, *extra: str):
    return runner.invoke(app, ["query", str(run), sql, *extra])


@pytest.mark.parametrize("sql", [
    "select * from read_csv('/etc/passwd')",
    "select * from read_text('/etc/hostname')",
    "select * from glob('/etc/*')",
    "COPY (select 1) TO '{tmp}/copied.csv'",
    "ATTACH '{tmp}/other.db'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "CREATE OR REPLACE VIEW requests AS SELECT 1 AS x",
    "DROP VIEW requests",
    "CREATE TABLE t AS SELECT 1",
    "SET enable_external_access = true",
    "select 1; SET lock_configuration = false",
    "EXPORT DATABASE '{tmp}/exported'",
])
def test_escapes_are_refused(run, tmp_path, sql) -> None:
    r = _query(run, sql.format(tmp=tmp_path))
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("prefixscan: error: ") and len(r.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_the_runs_own_tables_still_answer(run) -> None:
    cols, rows = run_query(str(run), "select count(*) as n from requests")
    assert rows == [(9,)]
    cols, rows = run_query(str(run), f"select count(*) from read_parquet('{(run / 'prefixes.parquet').resolve()}')")
    assert rows[0][0] >= 0
    cols, rows = run_query(str(run), "describe requests")
    assert "block_hashes" in [r[0] for r in rows]


def test_crafted_file_names_do_not_become_sql(run, tmp_path) -> None:
    evil = run / "x\" AS SELECT 1; CREATE VIEW pwned AS SELECT 'pwned' AS p; --.parquet"
    evil.write_bytes((run / "rejects.parquet").read_bytes())
    try:
        cols, rows = run_query(str(run), "select table_name from information_schema.tables order by 1")
        names = [r[0] for r in rows]
        assert "pwned" not in names and not any('"' in n for n in names)
        assert set(names) == set(json.loads((run / "manifest.json").read_text())["tables"])
    finally:
        evil.unlink()


def test_output_rules(run, tmp_path) -> None:
    manifest = (run / "manifest.json").read_bytes()
    for target in (run / "manifest.json", run / "new.csv"):
        for force in ([], ["--force"]):
            r = _query(run, "select 1 as x", "--format", "csv", "-o", str(target), *force)
            assert r.exit_code == 2 and "inside the run directory" in r.stderr
    assert (run / "manifest.json").read_bytes() == manifest and not (run / "new.csv").exists()
    out = tmp_path / "out.csv"
    assert _query(run, "select 1 as x", "--format", "csv", "-o", str(out)).exit_code == 0
    assert out.read_text().splitlines() == ["x", "1"]
    r = _query(run, "select 2 as x", "--format", "csv", "-o", str(out))
    assert r.exit_code == 2 and "exists; pass --force" in r.stderr and out.read_text().splitlines()[1] == "1"
    assert _query(run, "select 2 as x", "--format", "csv", "-o", str(out), "--force").exit_code == 0
    assert out.read_text().splitlines() == ["x", "2"]
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]  # no temporary left beside it
    r = _query(run, "select 1 as x", "-o", str(tmp_path / "t.txt"))  # table format to a file
    assert r.exit_code == 0 and "x" in (tmp_path / "t.txt").read_text()


def test_canned_queries_come_from_the_package(run) -> None:
    names = canned_queries()
    assert "hit_rate_by_tenant" in names and len(names) >= 6
    r = runner.invoke(app, ["query", "--list"])
    assert r.exit_code == 0 and all(n in r.stdout for n in names)
    by_at = _query(run, "@hit_rate_by_tenant", "--format", "json")
    by_opt = runner.invoke(app, ["query", str(run), "--canned", "hit_rate_by_tenant", "--format", "json"])
    old_path = _query(run, "@queries/hit_rate_by_tenant.sql", "--format", "json")
    assert by_at.exit_code == by_opt.exit_code == old_path.exit_code == 0
    assert json.loads(by_at.stdout) == json.loads(by_opt.stdout) == json.loads(old_path.stdout) != []
    r = _query(run, "@no_such_query")
    assert r.exit_code == 2 and "--list" in r.stderr


def test_table_values_are_printed_safely(run) -> None:
    r = _query(run, "select '[bold]x[/bold] \x1b[2J\x1b]8;;http://evil\x1b\\\\y' as v")
    assert r.exit_code == 0
    assert "[bold]x[/bold]" in r.stdout and "\x1b" not in r.stdout and "evil" not in r.stdout


@pytest.mark.parametrize("sql", [
    "select * from read_csv('/etc/passwd')",
    "COPY (select 1) TO '{tmp}/copied.csv'",
    "ATTACH '{tmp}/other.db'",
    "INSTALL httpfs",
    "SET enable_external_access = true",
    "SET allowed_paths = ['/etc/passwd']",
])
def test_the_connection_itself_is_sandboxed(run, tmp_path, sql) -> None:
    """Below the read-only statement check: DuckDB's own settings refuse the same escapes."""
    import duckdb

    from prefixscan.query import connect

    con = connect(str(run))
    with pytest.raises(duckdb.Error):
        con.execute(sql.format(tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []
    assert con.execute("select count(*) from requests").fetchone() == (9,)
