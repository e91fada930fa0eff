"""`prefixscan report`: Markdown and self-contained HTML report from a run directory, without re-analysing."""

from __future__ import annotations

import typer

from prefixscan.cli.choices import REPORT_FORMATS, one_of
from prefixscan.cli.common import handle_errors
from prefixscan.cli.estimate import ScenarioOptions, simulation_option
from prefixscan.cli.groups import grouped
from prefixscan.errors import UsageError
from prefixscan.report.escape import clean

FORMATS = {"md": ("md",), "html": ("html",), "both": ("md", "html")}


def register(app: typer.Typer) -> None:
    """Add the `report` command to the application."""

    @app.command("report")
    @handle_errors
    @grouped
    def report(
        run_dir: str = typer.Argument(..., help="Run directory from `prefixscan analyze` (and simulate, ...)."),
        output: str | None = typer.Option(None, "--output", "-o", help="Directory to write to (default: RUN_DIR)."),
        fmt: str = typer.Option("both", "--format", "-f", metavar=one_of(REPORT_FORMATS),
                                help="Markdown, HTML or both."),
        scenario: ScenarioOptions = ...,  # type: ignore[assignment]  # its options (cli/groups.py)
        compare_to: str | None = typer.Option(None, "--compare-to",
                                              help="An earlier run (say, before a template change): adds a "
                                                   "before/after section (`prefixscan diff`)."),
        simulation: str | None = simulation_option("report"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not print the paths written."),
    ) -> None:
        """Write report.md (figures in report_figures/) and a self-contained report.html for a run.

        Re-renders from the run's tables without re-analysing. Every section uses one scenario, named at
        the top with where each value came from: the one saved by `prefixscan estimate` (estimate.json),
        with any scenario option given here overriding it field by field (round robin and the router are
        replayed for it when the saved simulation ran another one). A section whose data is missing names
        the command that produces it.
        """
        from prefixscan.report.write import write_report
        from prefixscan.run.load import Run

        given, sources = scenario.given()
        if fmt not in FORMATS:
            raise UsageError(f"--format must be md, html or both, got {fmt!r}")
        run = Run.open(run_dir, simulation)  # an unknown name: one line listing the stored ones, before any work
        written = write_report(run, output, FORMATS[fmt], compare_to=compare_to, sources=sources or None, **given)
        for kind in ("md", "html"):
            if kind in written and not quiet:
                typer.echo(clean(str(written[kind])))  # -o NAME is echoed: its controls shown, not sent
