"""`prefixscan report`: Markdown and self-contained HTML report from a run directory, without re-analysing."""

from __future__ import annotations

import typer

from prefixscan.cli.common import handle_errors
from prefixscan.errors import UsageError

FORMATS = {"md": ("md",), "html": ("html",), "both": ("md", "html")}


def register(app: typer.Typer) -> None:
    """Add the `report` command to the application."""

    @app.command("report")
    @handle_errors
    def report(
        run_dir: str = typer.Argument(
            ..., help="Run directory from `prefixscan analyze` (and simulate, ...)."
        ),
        output: str | None = typer.Option(
            None, "--output", "-o", help="Directory to write to (default: RUN_DIR)."
        ),
        fmt: str = typer.Option("both", "--format", "-f", help="md, html or both."),
        model: str | None = typer.Option(
            None,
            "--model",
            "-m",
            help="Model for KV GiB and cost (default: the simulation's, else llama-3.1-70b).",
        ),
        gpu: str | None = typer.Option(
            None, "--gpu", help="GPU for the cost section (default: the simulation's, else h100)."
        ),
        dtype: str | None = typer.Option(
            None, "--dtype", help="Weights/KV dtype: bf16 or fp8 (default bf16)."
        ),
        replicas: int | None = typer.Option(
            None, "--replicas", help="Replicas for the cost section when the run has no simulation."
        ),
    ) -> None:
        """Write report.md (figures in report_figures/) and a self-contained report.html for a run.

        Re-renders from the run's tables and manifest without re-analysing; a section whose data is
        missing names the command that produces it.
        """
        from prefixscan.report.model import write_report

        if fmt not in FORMATS:
            raise UsageError(f"--format must be md, html or both, got {fmt!r}")
        written = write_report(
            run_dir, output, FORMATS[fmt], model=model, gpu=gpu, dtype=dtype, replicas=replicas
        )
        for kind in ("md", "html"):
            if kind in written:
                typer.echo(str(written[kind]))
