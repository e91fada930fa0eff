"""`prefixscan query RUN_DIR "SQL"`: DuckDB over the run's tables, one read-only view per table."""

from __future__ import annotations

import sys

import typer

from prefixscan.cli.choices import QUERY_FORMATS, one_of
from prefixscan.cli.common import handle_errors, stdout_console
from prefixscan.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def query(
        run_dir: str = typer.Argument(None, help="Run directory written by `prefixscan analyze -o`."),
        sql: str = typer.Argument(None, help="One SELECT (or EXPLAIN [ANALYZE] of one), @path/to/file.sql, "
                                  "or @NAME of a canned query (see --list)."),
        canned: str = typer.Option(None, "--canned", help="Run the canned query NAME (see --list)."),
        list_canned: bool = typer.Option(False, "--list", help="List the canned queries and exit."),
        fmt: str = typer.Option("table", "--format", metavar=one_of(QUERY_FORMATS),
                                help="table (rich), csv, json or parquet (parquet needs -o)."),
        output: str = typer.Option(None, "-o", "--output",
                                   help="Write the result to this file (never inside a run directory)."),
        force: bool = typer.Option(False, "--force", help="Replace an existing -o file."),
        limit: int = typer.Option(200, "--limit", help="Rows shown in table format (0 = all)."),
        quiet: bool = typer.Option(False, "--quiet", "-q",
                                   help="Only the result: no note on rows left out of the table."),
        simulation: str = typer.Option(
            None, "--simulation", metavar="NAME",
            help="Whose sim_* tables the views show (`simulate --name`; default: 'default', else the most recent)."),
    ) -> None:
        """Run one read-only SQL statement over a run directory with DuckDB (tables: requests, rejects, summaries,
        prefixes, ...). The query sees only the run's tables: no other file, no network, no writes; any statement
        but a SELECT is refused before it runs (docs/query.md).

        Example: prefixscan query runs/demo "select tenant, sum(cached_tokens) from requests group by 1"
        """
        from prefixscan.query import canned_queries, check_output, encode_result, run_query, write_output

        if list_canned:
            for name, question in canned_queries().items():
                typer.echo(f"{name:34s} {question}")
            return
        if run_dir is None or (sql is None) == (canned is None):
            raise UsageError("give RUN_DIR and either SQL or --canned NAME (`prefixscan query --help`)")
        if fmt == "parquet" and not output:
            raise UsageError("--format parquet needs -o FILE")
        target = check_output(output, force) if output else None  # before the query runs
        from prefixscan.run.load import load_run

        run = load_run(run_dir, simulation)  # the views: its tables and that simulation's sim_* tables
        cols, rows = run_query(run, f"@{canned}" if canned else sql)
        if fmt != "table":
            data = encode_result(cols, rows, fmt, for_terminal=target is None and sys.stdout.isatty())
            if target is None:
                sys.stdout.write(data.decode())
            else:
                write_output(target, data)
            return
        _print_table(cols, rows, limit, target, quiet)


def _print_table(cols: list, rows: list, limit: int, target, quiet: bool = False) -> None:
    import io

    from rich.console import Console

    from prefixscan.report.query_terminal import result_table

    shown = rows if limit <= 0 else rows[:limit]
    buf = io.StringIO() if target is not None else None
    console = Console(file=buf, width=200, emoji=False) if buf is not None else stdout_console()
    console.print(result_table(cols, shown, None if buf is not None else console.width))
    if len(shown) < len(rows) and not quiet:
        console.print(f"({len(rows) - len(shown)} more rows; use --limit 0 or --format csv)")
    if buf is not None:
        from prefixscan.query import write_output

        write_output(target, buf.getvalue().encode())
