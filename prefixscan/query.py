"""DuckDB over a run directory: one view per Parquet table, SQL in, rows out."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

from prefixscan.errors import UsageError
from prefixscan.io.rundir import load_run

FORMATS = ("table", "csv", "json", "parquet")


def connect(run_dir: str):  # noqa: ANN201 - duckdb is imported lazily
    """An in-memory DuckDB connection with a view per table of the run."""
    import duckdb

    run = load_run(run_dir)
    con = duckdb.connect(":memory:")
    for name in run.tables():
        path = str(run.path / f"{name}.parquet").replace("'", "''")
        con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM read_parquet(\'{path}\')')
    return con


def load_sql(sql: str) -> str:
    if sql.startswith("@"):
        p = Path(sql[1:])
        if not p.exists():
            raise UsageError(f"SQL file {p} does not exist")
        return p.read_text()
    return sql


def run_query(run_dir: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of a query over the run."""
    import duckdb

    con = connect(run_dir)
    try:
        rel = con.execute(load_sql(sql))
    except duckdb.Error as exc:
        raise UsageError(f"query failed: {str(exc).splitlines()[0]}") from None
    cols = [d[0] for d in rel.description or []]
    return cols, rel.fetchall()


def render_result(cols: list[str], rows: list[tuple[Any, ...]], fmt: str, output: str | None, limit: int) -> None:
    """Print or write a query result in the requested format."""
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        if not output:
            raise UsageError("--format parquet needs -o FILE")
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([dict(zip(cols, r, strict=True)) for r in rows]), output)
        return
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(cols)
        w.writerows(rows)
        text = buf.getvalue()
    elif fmt == "json":
        text = json.dumps([dict(zip(cols, r, strict=True)) for r in rows], default=str, indent=2) + "\n"
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(show_edge=False)
        for c in cols:
            t.add_column(c)
        shown = rows if limit <= 0 else rows[:limit]
        for r in shown:
            t.add_row(*("" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v)) for v in r))
        wide = output or not sys.stdout.isatty()
        console = Console(file=open(output, "w") if output else sys.stdout, width=200 if wide else None)
        console.print(t)
        if len(shown) < len(rows):
            console.print(f"({len(rows) - len(shown)} more rows; use --limit 0 or --format csv)")
        return
    if output:
        Path(output).write_text(text)
    else:
        sys.stdout.write(text)
