"""`prefixscan check RUN`: CI gates over a run (minimum hit rate, maximum breaker cost, severity)."""

from __future__ import annotations

import typer

from prefixscan.cli.common import handle_errors, json_or_quiet
from prefixscan.errors import EXIT_CHECK_FAILED


def register(app: typer.Typer) -> None:
    """Add the `check` command to the application."""

    @app.command("check", no_args_is_help=True)
    @handle_errors
    def check(
        run_dir: str = typer.Argument(..., help="Run directory written by `prefixscan analyze -o`."),
        min_hit_rate: float | None = typer.Option(None, "--min-hit-rate",
                                                  help="Fail when the hit rate is below this fraction (0.4 = 40%)."),
        definition: str = typer.Option(
            "token_weighted", "--definition",
            help="Hit rate for --min-hit-rate: token_weighted, block_weighted, request_mean, "
                 "steady_state_token_weighted, steady_state_block_weighted, steady_state_request_mean, "
                 "tenant_isolated_token_weighted."),
        max_breaker_tokens: int | None = typer.Option(
            None, "--max-breaker-tokens", help="Fail when cache breakers cost more prompt tokens of reuse than this."),
        fail_on: str | None = typer.Option(
            None, "--fail-on", help="Fail on any breaker of this severity or above: low, medium (>= 1% of the "
                                    "run's prompt tokens), high (>= 5%)."),
        max_warm_ttft_p95: float | None = typer.Option(
            None, "--max-warm-ttft-p95", help="Fail when the pilot's warm requests' TTFT p95 exceeds this many "
                                              "seconds (0.25 = 250 ms; docs/pilot.md)."),
        max_prediction_gap: float | None = typer.Option(
            None, "--max-prediction-gap", help="Fail when the predicted hit rate exceeds the engine's measured one "
                                               "by more than this fraction (0.1 = 10 points)."),
        max_left_warm: float | None = typer.Option(
            None, "--max-left-warm", help="Fail when more than this share of the router's decisions left a warm "
                                          "candidate (needs analyze --decisions)."),
        allow_uncheckable: bool = typer.Option(
            False, "--allow-uncheckable", help="Let gates the run cannot answer (breaker gates without prompt text, "
                                               "pilot gates without latency, engine counts or a decision log) pass "
                                               "as not checkable instead of failing."),
        json_out: bool = typer.Option(False, "--json", help="Print the gates as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only failed gates and the verdict."),
    ) -> None:
        """Gate a build on a run's prefix reuse: exit 0 when every gate holds, 8 when one fails.

        One line per gate (PASS/FAIL with the value seen), then the verdict. A breaker gate on a run without
        prompt text (a hashed trace), or a pilot gate on a run without its data, is NOT CHECKABLE and fails
        (exit 8) unless --allow-uncheckable. Usage errors exit 2, a missing or incomplete run directory 5, a bug 1.
        Example: prefixscan check runs/demo --min-hit-rate 0.4 --fail-on high
        Example: prefixscan check runs/pilot --max-warm-ttft-p95 0.25 --max-prediction-gap 0.1 --max-left-warm 0.2
        """
        from prefixscan.compare.check import PilotGates, check_run
        from prefixscan.report.compare_terminal import check_lines

        result = check_run(run_dir, min_hit_rate, definition, max_breaker_tokens, fail_on, allow_uncheckable,
                           PilotGates(max_warm_ttft_p95, max_prediction_gap, max_left_warm))
        if not json_or_quiet(json_out, False, result.to_json()):  # -q here: only the failed gates
            for line in check_lines(result, quiet):
                typer.echo(line)
        if not result.passed:
            raise typer.Exit(EXIT_CHECK_FAILED)
