"""DuckDB over a run directory: one read-only relation per table of the run, one read-only statement in, rows out.

The connection is a sandbox: each table is registered as an Arrow dataset (DuckDB opens no file of the
run), then DuckDB's external access is switched off with no path left allowed, Python replacement scans and
extensions are off, and the configuration is locked, so SQL cannot read other files, write any file, ATTACH
databases or turn the settings back. Before anything runs, the SQL must parse as exactly one SELECT whose
parse tree only reads (`read_only_sql`), or EXPLAIN [ANALYZE] of one. Table names come from the run's
manifest, checked, never from arbitrary file names. docs/query.md.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from prefixscan.errors import EnvError, RunDirError, UsageError
from prefixscan.run.load import PLAIN_TABLE, Run, load_run
from prefixscan.run.rundir import run_containing

FORMATS = ("table", "csv", "json", "parquet")


def run_tables(run: Run) -> dict[str, Path]:
    """The run's tables by name: those the manifest lists (else the Parquet files present), plus the chosen
    simulation's `sim_*` tables from its own directory (prefixscan.run.simstore), each a plain identifier
    whose file is a regular file inside the run directory (no symlink out)."""
    listed = run.manifest.get("tables")
    names = sorted(listed) if isinstance(listed, dict) else run.tables()
    names = [n for n in names if not n.startswith("sim_")] + run.sim_tables()
    root = run.path.resolve()
    out: dict[str, Path] = {}
    for name in names:
        p = run.file(name)
        if PLAIN_TABLE.fullmatch(name) and p is not None and p.is_file() and not p.is_symlink() \
                and p.resolve().is_relative_to(root):
            out[name] = run.checked_file(name).resolve()  # a damaged file: one line, exit 5
    return out


def register_tables(con: Any, tables: dict[str, Path]) -> None:
    """Give the connection one read-only relation per table: a lazily scanned Arrow dataset registered under
    the table's name. DuckDB itself never opens a file of the run, so no path has to stay reachable once the
    sandbox is locked (an allowed path is writable too: `COPY ... TO` the run's own file)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    for name, path in tables.items():
        try:
            con.register(name, ds.dataset(path, format="parquet"))
        except (pa.ArrowException, OSError) as exc:
            raise RunDirError(f"table {name} ({path.name}) cannot be read: {str(exc).splitlines()[0]}; "
                              "the run directory is damaged (re-run the command that wrote it)") from None


def lock(con: Any) -> None:
    """Switch the connection's escapes off, then lock its settings so SQL cannot switch them back: no file or
    network access (nothing to read, write or attach), no Python variables as tables, no extensions."""
    for setting in ("python_enable_replacements = false", "allow_community_extensions = false",
                    "autoinstall_known_extensions = false", "autoload_known_extensions = false",
                    "enable_external_access = false", "lock_configuration = true"):
        con.execute(f"SET {setting}")


def connect(run_dir: str | os.PathLike[str] | Run):  # duckdb is imported lazily
    """An in-memory, sandboxed DuckDB connection with a read-only relation per table of the run."""
    import duckdb

    tables = run_tables(load_run(run_dir))
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    register_tables(con, tables)
    lock(con)
    return con


def queries_dir() -> Traversable:
    """Where the canned queries are: `prefixscan/queries/` in an installed wheel (the build copies the top-level
    `queries/` folder there, setup.py), else the checkout's own `queries/` (a source tree or editable install)."""
    packaged = resources.files("prefixscan").joinpath("queries")
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "queries").is_dir():
        return checkout / "queries"
    raise EnvError("the canned queries are missing: neither prefixscan/queries/ (installed) nor queries/ "
                   "(checkout) exists; reinstall prefixscan")


def canned_queries() -> dict[str, str]:
    """The canned queries shipped with prefixscan: name -> the question (the file's first comment line)."""
    files = sorted((f for f in queries_dir().iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return {f.name[:-4]: (f.read_text().splitlines() or [""])[0].removeprefix("--").strip() for f in files}


def load_sql(sql: str) -> str:
    """SQL text, `@path/to/file.sql`, or `@name` of a canned query (`@queries/name.sql` too)."""
    if not sql.startswith("@"):
        return sql
    ref = sql[1:]
    p = Path(ref)
    if p.is_file():
        return p.read_text()
    name = p.stem if ref.endswith(".sql") else ref
    if name in canned_queries():
        return queries_dir().joinpath(f"{name}.sql").read_text()
    raise UsageError(f"SQL file {ref} does not exist and no canned query is named {name!r} "
                     "(`prefixscan query --list` shows them)")


_REFUSED = ("query is read-only: {what} is refused (one SELECT runs, or EXPLAIN [ANALYZE] of one; DESCRIBE, "
            "SHOW, SUMMARIZE, VALUES and FROM-first queries are SELECTs); write results elsewhere with --format and -o")
_LEADING = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*EXPLAIN\s+(ANALYZE\s+)?", re.IGNORECASE | re.DOTALL)


def _one_statement(con: Any, sql: str) -> Any:
    """The single statement `sql` holds, as DuckDB's parser sees it (several, or none, is a usage error)."""
    statements = con.extract_statements(sql)
    if not statements:
        raise UsageError("no SQL statement given")
    if len(statements) > 1:
        raise UsageError(f"give one SQL statement ({len(statements)} given): query runs exactly one SELECT")
    try:
        statements[0].type  # noqa: B018 - read here: it raises for a type the Python API has no name for
    except ValueError:  # `UPDATE EXTENSIONS` on DuckDB 2.0.1
        raise UsageError(_REFUSED.format(what="a statement of a type DuckDB's Python API cannot name")) from None
    return statements[0]


def _query_nodes(con: Any, sql: str) -> set[str] | None:
    """Every query node of a SELECT's parse tree (DuckDB's own serialisation of it): a SELECT statement may
    still hold a writing node, as in `WITH x AS (COPY ... TO 'f') SELECT 1`. None when DuckDB cannot
    serialise the statement (then it cannot be checked, and is refused)."""
    tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if tree.get("error"):
        return None
    found: set[str] = set()
    todo: list[Any] = [tree]
    while todo:
        o = todo.pop()
        if isinstance(o, dict):
            kind = o.get("type")
            if isinstance(kind, str) and kind.endswith("_NODE"):
                found.add(kind)
            todo.extend(o.values())
        elif isinstance(o, list):
            todo.extend(o)
    return found


READ_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})


def read_only_sql(con: Any, sql: str) -> str:
    """The statement to run for `sql`, if its parsed form only reads; else a UsageError naming what it is.

    An allow-list over DuckDB's parse, not a list of refused words: exactly one statement, of type SELECT,
    whose parse tree holds only reading query nodes (`READ_NODES`). EXPLAIN is run only as `EXPLAIN
    [ANALYZE]` of such a SELECT, rebuilt here, because EXPLAIN ANALYZE executes the statement it explains."""
    import duckdb

    st = _one_statement(con, sql)
    prefix = ""
    if st.type == duckdb.StatementType.EXPLAIN:
        m = _LEADING.match(st.query)
        if m is None:
            raise UsageError(_REFUSED.format(what="this EXPLAIN form"))
        prefix = "EXPLAIN ANALYZE " if m.group(1) else "EXPLAIN "
        try:
            st = _one_statement(con, st.query[m.end():])
        except duckdb.Error:
            raise UsageError(_REFUSED.format(what="EXPLAIN of anything but a SELECT")) from None
        if st.type != duckdb.StatementType.SELECT:
            raise UsageError(_REFUSED.format(what=f"EXPLAIN of a {st.type.name} statement"))
    if st.type != duckdb.StatementType.SELECT:
        raise UsageError(_REFUSED.format(what=f"a {st.type.name} statement"))
    nodes = _query_nodes(con, st.query)
    if nodes is None:
        raise UsageError(_REFUSED.format(what="a SELECT whose parse DuckDB cannot serialise for checking"))
    other = nodes - READ_NODES
    if other:
        inner = ", ".join(sorted(n.removesuffix("_NODE").removesuffix("_QUERY") for n in other))
        raise UsageError(_REFUSED.format(what=f"a SELECT with {inner} inside"))
    return prefix + st.query


def run_query(run_dir: str | os.PathLike[str] | Run, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of one read-only statement over the run (a path or a `Run`, whose chosen
    simulation gives the `sim_*` tables; `read_only_sql` decides what runs)."""
    import duckdb

    text = load_sql(sql)
    con = connect(run_dir)
    try:
        rel = con.execute(read_only_sql(con, text))
        cols = [d[0] for d in rel.description or []]
        return cols, rel.fetchall()
    except duckdb.Error as exc:
        raise UsageError(f"query failed: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()


def encode_result(cols: list[str], rows: list[tuple[Any, ...]], fmt: str, for_terminal: bool = False) -> bytes:
    """A result as CSV, JSON or Parquet bytes (`table` is rendered by report.query_terminal). Exact data for
    a file or a pipe; `for_terminal` makes control characters in CSV text visible (`escape.visible`), so
    a value cannot act on the terminal (JSON escapes them itself: `\u001b`)."""
    if fmt == "csv":
        from prefixscan.report.escape import visible

        def shown(row: Any) -> list[Any]:
            return [visible(v) if isinstance(v, str) else v for v in row]

        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(shown(cols) if for_terminal else cols)
        w.writerows(shown(r) for r in rows) if for_terminal else w.writerows(rows)
        return buf.getvalue().encode("utf-8", "backslashreplace")
    if fmt == "json":
        return (json.dumps([dict(zip(cols, r, strict=True)) for r in rows], default=str, indent=2) + "\n").encode()
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist([dict(zip(cols, r, strict=True)) for r in rows]), sink)
        return sink.getvalue().to_pybytes()
    raise UsageError(f"--format must be one of {', '.join(FORMATS)}")


def check_output(output: str, force: bool) -> Path:
    """Refuse an output file that exists (without `force`), is a directory, or lies in a run directory."""
    target = Path(output)
    run = run_containing(target.parent if not target.is_dir() else target)
    if run is not None:
        raise UsageError(f"-o {output} is inside the run directory {run}: query never writes into a run; "
                         "choose a path outside it")
    if target.is_dir():
        raise UsageError(f"-o {output} is a directory; give a file name")
    if target.exists() and not force:
        raise UsageError(f"-o {output} exists; pass --force to replace it")
    if not target.parent.is_dir():
        raise UsageError(f"-o {output}: directory {target.parent} does not exist")
    return target


def write_output(target: Path, data: bytes) -> None:
    """Write a result file atomically (prefixscan.run.atomic: a temporary name beside it, then a rename), so a
    failed write leaves the old file, or none; `check_output` already refused what must not be replaced."""
    from prefixscan.run.atomic import write_bytes

    write_bytes(target, data, force=True)
