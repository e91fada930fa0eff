"""`prefixscan explain RUN_DIR REQUEST_ID`: why one request hit or missed, block by block."""

from __future__ import annotations

import typer

from prefixscan.cli.common import handle_errors, json_or_quiet


def register(app: typer.Typer) -> None:
    """Add the `explain` command to the application."""

    @app.command("explain", no_args_is_help=True)
    @handle_errors
    def explain(
        run_dir: str = typer.Argument(..., help="Run directory written by `prefixscan analyze -o`."),
        request_id: str = typer.Argument(..., help="The request to explain (the requests table's request_id)."),
        include_text: bool = typer.Option(False, "--include-text",
                                          help="Show the text around the divergence (off: offsets, lengths and "
                                               "hashes only)."),
        json_out: bool = typer.Option(False, "--json", help="Print the explanation as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but what --json asks for."),
    ) -> None:
        """Block by block: which blocks hit and which earlier request (tenant, conversation) first computed
        them; where the prompt diverged from its best earlier match (message, character, token); the
        findings whose fix rewrites it; and its miss split (breaker, routing, eviction, unexplained).

        The message and character need the original log at the path the run recorded; a hashed trace
        explains by blocks only.
        Example: prefixscan explain runs/demo req-000042
        """
        from prefixscan.reuse.explain import explain as _explain

        ex = _explain(run_dir, request_id, include_text=include_text).to_json()
        if json_or_quiet(json_out, quiet, ex, default=str):
            return
        from prefixscan.cli.common import stdout_console
        from prefixscan.report.explain_terminal import render_explanation

        render_explanation(ex, stdout_console())
