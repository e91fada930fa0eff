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
    cols, rows = run_query(str(run), "describe requests")
    assert "block_hashes" in [r[0] for r in rows]
    for sql in ("explain select count(*) from requests", "explain analyze select count(*) from requests",
                "summarize requests", "with t as (select tenant from requests) select count(*) from t",
                "select 1 union all select 2", "from requests select count(*)", "values (1), (2)"):
        assert run_query(str(run), sql)[1], sql


def test_no_file_is_reachable_not_even_the_runs_own(run) -> None:
    """The tables are Arrow datasets registered in the connection: DuckDB opens no path, so none is allowed
    (an allowed path would be writable too)."""
    r = _query(run, f"select count(*) from read_parquet('{(run / 'requests.parquet').resolve()}')")
    assert r.exit_code == 2 and "file system operations are disabled" in r.stderr


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
    assert "[bold]x[/bold]" in r.stdout and "\x1b" not in r.stdout and "\\x1b[2J" in r.stdout


@pytest.mark.parametrize("sql", [
    "select * from read_csv('/etc/passwd')",
    "COPY (select 1) TO '{tmp}/copied.csv'",
    "ATTACH '{tmp}/other.db'",
    "INSTALL httpfs",
    "SET enable_external_access = true",
    "SET allowed_paths = ['/etc/passwd']",
    "EXPLAIN ANALYZE COPY (SELECT 42 AS pwned) TO 'RUN/requests.parquet' (FORMAT parquet, USE_TMP_FILE false)",
    "WITH x AS (COPY (SELECT 1) TO 'RUN/x.csv') SELECT 1",
    "select * from read_parquet('RUN/requests.parquet')",
    "SET python_enable_replacements = true",
])
def test_the_connection_itself_is_sandboxed(run, tmp_path, sql) -> None:
    """Below the read-only statement check: DuckDB's own settings refuse the same escapes."""
    import duckdb

    from prefixscan.query import connect

    before = _hashes(run)
    con = connect(str(run))
    with pytest.raises(duckdb.Error):
        con.execute(sql.format(tmp=tmp_path).replace("RUN", str(run)))
    assert list(tmp_path.iterdir()) == [] and _hashes(run) == before
    assert con.execute("select count(*) from requests").fetchone() == (9,)


def _hashes(d: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


# One example per duckdb.StatementType member that SQL can produce on the installed DuckDB (2.0.1). `RUN`
# is replaced by the run directory, so a write that got through would land among the run's own files.
STATEMENT_EXAMPLES = {
    "INSERT": "INSERT INTO requests SELECT * FROM requests",
    "UPDATE": "UPDATE requests SET tenant = 'x'",
    "CREATE": "CREATE TABLE t AS SELECT 1",
    "DELETE": "DELETE FROM requests",
    "PREPARE": "PREPARE p AS SELECT 1",
    "EXECUTE": "EXECUTE p",
    "ALTER": "ALTER VIEW requests RENAME TO r2",
    "TRANSACTION": "BEGIN TRANSACTION",
    "COPY": "COPY (SELECT 42 AS pwned) TO 'RUN/requests.parquet' (FORMAT parquet, USE_TMP_FILE false)",
    "EXPLAIN": "EXPLAIN ANALYZE COPY (SELECT 42 AS pwned) TO 'RUN/requests.parquet' (FORMAT parquet)",
    "DROP": "DROP VIEW requests",
    "EXPORT": "EXPORT DATABASE 'RUN/exported'",
    "PRAGMA": "PRAGMA enable_profiling",
    "VACUUM": "VACUUM",
    "CALL": "CALL pragma_version()",
    "SET": "SET enable_external_access = true",
    "LOAD": "LOAD httpfs",
    "ATTACH": "ATTACH 'RUN/other.db' AS other",
    "DETACH": "DETACH other",
    "MULTI": "PIVOT requests ON tenant USING count(*)",
    "MERGE_INTO": "MERGE INTO requests USING requests r ON false WHEN NOT MATCHED THEN INSERT VALUES (1)",
}
# Members no SQL text parses to on this DuckDB: INVALID, RELATION and LOGICAL_PLAN are API-only; ANALYZE
# parses as VACUUM, CREATE MACRO/SECRET as CREATE, COPY FROM DATABASE as PRAGMA, SET VARIABLE as SET.
NO_SQL = {"INVALID", "RELATION", "LOGICAL_PLAN", "ANALYZE", "CREATE_FUNC", "EXTENSION", "COPY_DATABASE", "VARIABLE_SET"}
MORE_ESCAPES = [
    "EXPLAIN COPY (SELECT 1) TO 'RUN/x.csv'",
    "/* c */ explain /* c */ analyze copy (select 1) to 'RUN/x.csv'",
    "EXPLAIN (FORMAT json) COPY (SELECT 1) TO 'RUN/x.csv'",
    "WITH x AS (COPY (SELECT 42 AS pwned) TO 'RUN/requests.parquet' (FORMAT parquet)) SELECT 1",
    "FROM (WITH x AS (COPY (SELECT 1) TO 'RUN/x.csv') SELECT 1)",
    "WITH x AS (INSERT INTO requests SELECT * FROM requests RETURNING 1) SELECT * FROM x",
    "select * from requests where 1 in (with y as (delete from requests returning 1) select * from y)",
    "ANALYZE", "CREATE MACRO m(a) AS a + 1", "CREATE SECRET s (TYPE s3)", "COPY FROM DATABASE memory TO other",
    "INSTALL httpfs", "FORCE INSTALL httpfs", "UPDATE EXTENSIONS", "LOAD 'RUN/x.duckdb_extension'",
    "RESET enable_external_access", "SET lock_configuration = false", "SET VARIABLE x = 1", "USE memory",
    "PRAGMA version", "CHECKPOINT", "COMMENT ON TABLE requests IS 'x'", "CREATE TYPE e AS ENUM ('a')",
    "ATTACH 'RUN/other.db' AS other; CREATE TABLE other.t AS SELECT * FROM requests",
    "ATTACH 'RUN/other.db' AS other; INSERT INTO other.t SELECT 1",
    "select 1; select 2", "select * from requests; COPY requests TO 'RUN/x.csv'",
]


def test_every_statement_type_is_covered() -> None:
    import duckdb

    members = set(duckdb.StatementType.__members__)
    assert members - NO_SQL - {"SELECT"} == set(STATEMENT_EXAMPLES)
    for kind, sql in STATEMENT_EXAMPLES.items():
        assert [st.type.name for st in duckdb.extract_statements(sql)] == [kind], sql
    reached = set()
    for sql in MORE_ESCAPES:
        try:
            reached |= {st.type.name for st in duckdb.extract_statements(sql)}
        except ValueError:  # UPDATE EXTENSIONS: a type the Python enum lacks
            pass
    assert not reached & NO_SQL


@pytest.mark.parametrize("sql", [*STATEMENT_EXAMPLES.values(), *MORE_ESCAPES])
def test_only_reads_run_and_nothing_changes(run, sql) -> None:
    """Every statement type but SELECT (and EXPLAIN [ANALYZE] of a reading SELECT) is refused before it
    runs, with one line and exit 2, and no file of the run directory is created, changed or removed."""
    before = _hashes(run)
    r = _query(run, sql.replace("RUN", str(run)))
    assert r.exit_code == 2, (sql, r.output)
    assert r.stderr.startswith("prefixscan: error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "read-only" in r.stderr or "one SQL statement" in r.stderr, r.stderr
    assert _hashes(run) == before
    assert run_query(str(run), "select count(*) from requests")[1] == [(9,)]


@pytest.mark.parametrize("sql", [
    "select * from read_text('/etc/passwd')", "select * from read_csv('/etc/passwd')",
    "select * from read_blob('/etc/passwd')", "select * from '/etc/passwd'", "select * from glob('/*')",
    "select * from read_json_auto('/etc/passwd')", "select * from read_parquet('RUN/requests.parquet')",
    "select * from duckdb_secrets()", "select * from duckdb_extensions()", "select * from tbl_from_python",
    # SQL inside a string escapes the parse-tree check; the connection's own settings still refuse the write
    "select * from json_execute_serialized_sql(json_serialize_sql("
    "'WITH x AS (COPY (SELECT 42 AS pwned) TO ''RUN/requests.parquet'' (FORMAT parquet)) SELECT 1'))",
    "select * from query('WITH x AS (COPY (SELECT 1) TO ''RUN/x.csv'') SELECT 1')",
])
def test_selects_reach_no_file(run, sql) -> None:
    before = _hashes(run)
    tbl_from_python = __import__("pyarrow").table({"x": [1]})  # noqa: F841 - a replacement scan would find it
    r = _query(run, sql.replace("RUN", str(run)))
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "query failed" in r.stderr, r.output
    assert "root:" not in r.output and _hashes(run) == before


def test_the_reported_escape_is_refused_and_harmless(run) -> None:
    """issue 28: EXPLAIN ANALYZE runs the statement it explains; this one rewrote requests.parquet."""
    before = _hashes(run)
    sql = (f"EXPLAIN ANALYZE COPY (SELECT 42 AS pwned) TO '{run}/requests.parquet' "
           "(FORMAT parquet, USE_TMP_FILE false)")
    r = _query(run, sql)
    assert r.exit_code == 2 and "EXPLAIN of a COPY statement is refused" in r.stderr
    assert _hashes(run) == before and run_query(str(run), "select count(*) from requests")[1] == [(9,)]


def test_a_damaged_table_is_a_run_directory_error(run, tmp_path) -> None:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "prefixes.parquet").write_bytes(b"PAR1 not really")
    r = _query(copy, "select count(*) from requests")
    assert r.exit_code == 5 and len(r.stderr.strip().splitlines()) == 1
    assert "prefixes.parquet" in r.stderr and "damaged" in r.stderr
