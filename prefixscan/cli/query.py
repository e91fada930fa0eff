"""`prefixscan query RUN_DIR "SQL"`: DuckDB over the run's tables, one view per table."""

from __future__ import annotations

import typer

from prefixscan.cli.common import handle_errors


def register(app: typer.Typer) -> None:
    @app.command(no_args_is_help=True)
    @handle_errors
    def query(
        run_dir: str = typer.Argument(..., help="Run directory written by `prefixscan analyze -o`."),
        sql: str = typer.Argument(..., help="SQL, or @path/to/file.sql (e.g. @queries/hit_rate_by_tenant.sql)."),
        fmt: str = typer.Option("table", "--format", help="table (rich), csv, json or parquet."),
        output: str = typer.Option(None, "-o", "--output", help="Write the result to this file."),
        limit: int = typer.Option(200, "--limit", help="Rows shown in table format (0 = all)."),
    ) -> None:
        """Run SQL over a run directory with DuckDB (tables: requests, rejects, summaries, prefixes, ...).

        Example: prefixscan query runs/demo "select tenant, sum(cached_tokens) from requests group by 1"
        """
        from prefixscan.query import render_result, run_query

        rel_cols, rows = run_query(run_dir, sql)
        render_result(rel_cols, rows, fmt, output, limit)
