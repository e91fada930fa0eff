"""DuckDB over a run directory: one read-only view per table of the run, SQL in, rows out.

The connection is a sandbox: the views are created, then DuckDB's external access is switched off (only
the run's own table files stay readable, through `allowed_paths`), extensions are neither installed nor
loaded, and the configuration is locked, so SQL cannot read other files, write files, ATTACH databases or
turn the settings back. Only read-only statements run (SELECT, EXPLAIN, DESCRIBE, SHOW, SUMMARIZE). View
names come from the run's manifest, checked and quoted, never from arbitrary file names. docs/query.md.
"""

from __future__ import annotations

import csv
import io
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from prefixscan.errors import UsageError
from prefixscan.io.rundir import MANIFEST, Run, load_run

FORMATS = ("table", "csv", "json", "parquet")
READ_ONLY = ("SELECT", "EXPLAIN")  # DESCRIBE, SHOW, SUMMARIZE and VALUES are SELECT statements to DuckDB
_TABLE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def run_tables(run: Run) -> dict[str, Path]:
    """The run's tables by name: those the manifest lists (else the Parquet files present), plus the chosen
    simulation's `sim_*` tables from its own directory (prefixscan.io.simstore), each a plain identifier
    whose file is a regular file inside the run directory (no symlink out)."""
    listed = run.manifest.get("tables")
    names = sorted(listed) if isinstance(listed, dict) else run.tables()
    names = [n for n in names if not n.startswith("sim_")] + run.sim_tables()
    root = run.path.resolve()
    out: dict[str, Path] = {}
    for name in names:
        p = run.file(name)
        if _TABLE_NAME.fullmatch(name) and p is not None and p.is_file() and not p.is_symlink() \
                and p.resolve().is_relative_to(root):
            out[name] = run.checked_file(name).resolve()  # a damaged file: one line, exit 5
    return out


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def connect(run_dir: str):  # noqa: ANN201 - duckdb is imported lazily
    """An in-memory, sandboxed DuckDB connection with a view per table of the run."""
    import duckdb

    tables = run_tables(load_run(run_dir))
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    for name, path in tables.items():
        con.execute(f"CREATE VIEW {ident(name)} AS SELECT * FROM read_parquet({literal(str(path))})")
    con.execute(f"SET allowed_paths = [{', '.join(literal(str(p)) for p in tables.values())}]")
    con.execute("SET allow_community_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def canned_queries() -> dict[str, str]:
    """The canned queries shipped in the package: name -> the question (the file's first comment line)."""
    out = {}
    for f in sorted(resources.files("prefixscan").joinpath("queries").iterdir(), key=lambda f: f.name):
        if f.name.endswith(".sql"):
            first = f.read_text().splitlines()[0] if f.read_text() else ""
            out[f.name[:-4]] = first.removeprefix("--").strip()
    return out


def canned_sql(name: str) -> str:
    if name not in canned_queries():
        raise UsageError(f"no canned query named {name!r}; `prefixscan query --list` shows them")
    return resources.files("prefixscan").joinpath("queries", f"{name}.sql").read_text()


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
        return canned_sql(name)
    raise UsageError(f"SQL file {ref} does not exist and no canned query is named {name!r} "
                     "(`prefixscan query --list` shows them)")


def run_query(run_dir: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of a read-only query over the run (the last statement's, given several)."""
    import duckdb

    con = connect(run_dir)
    try:
        statements = con.extract_statements(load_sql(sql))
        for st in statements:
            kind = st.type.name
            if kind not in READ_ONLY:
                raise UsageError(f"query is read-only: {kind} statements are refused (SELECT, EXPLAIN, DESCRIBE, "
                                 "SHOW and SUMMARIZE run); write results elsewhere with --format and -o")
        rel = None
        for st in statements:
            rel = con.execute(st.query)
    except duckdb.Error as exc:
        raise UsageError(f"query failed: {str(exc).splitlines()[0]}") from None
    if rel is None:
        raise UsageError("no SQL statement given")
    cols = [d[0] for d in rel.description or []]
    return cols, rel.fetchall()


def encode_result(cols: list[str], rows: list[tuple[Any, ...]], fmt: str) -> bytes:
    """A result as CSV, JSON or Parquet bytes (`table` is rendered by report.query_terminal)."""
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(cols)
        w.writerows(rows)
        return buf.getvalue().encode()
    if fmt == "json":
        return (json.dumps([dict(zip(cols, r, strict=True)) for r in rows], default=str, indent=2) + "\n").encode()
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist([dict(zip(cols, r, strict=True)) for r in rows]), sink)
        return sink.getvalue().to_pybytes()
    raise UsageError(f"--format must be one of {', '.join(FORMATS)}")


def enclosing_run(path: Path) -> Path | None:
    """The run directory (a directory holding manifest.json) that `path` is, or is inside, if any."""
    p = path.resolve()
    for d in (p, *p.parents):
        if d.is_dir() and (d / MANIFEST).is_file():
            return d
    return None


def check_output(output: str, force: bool) -> Path:
    """Refuse an output file that exists (without `force`), is a directory, or lies in a run directory."""
    target = Path(output)
    run = enclosing_run(target.parent if not target.is_dir() else target)
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
    """Write a result file atomically (prefixscan.io.atomic: a temporary name beside it, then a rename), so a
    failed write leaves the old file, or none; `check_output` already refused what must not be replaced."""
    from prefixscan.io.atomic import write_bytes

    write_bytes(target, data, force=True)
