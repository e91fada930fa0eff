"""`prefixscan diff RUN_A RUN_B`: before/after view of two runs (e.g. around a template change)."""

from __future__ import annotations

import typer

from prefixscan.cli.common import handle_errors, json_or_quiet, stdout_console


def register(app: typer.Typer) -> None:
    """Add the `diff` command to the application."""

    @app.command("diff", no_args_is_help=True)
    @handle_errors
    def diff(
        run_a: str = typer.Argument(..., help="The 'before' run directory."),
        run_b: str = typer.Argument(..., help="The 'after' run directory."),
        model: str | None = typer.Option(None, "--model", "-m",
                                         help="With --rps: also prefill GPUs of each run (catalogue model)."),
        gpu: str = typer.Option("h100", "--gpu", help="GPU for --model: h100, h200, b200, a100, l40s, mi300x."),
        rps: float | None = typer.Option(None, "--rps", help="Request rate for the prefill GPU figures."),
        dtype: str = typer.Option("bf16", "--dtype", help="Compute dtype for --model: bf16 or fp8."),
        mfu: float = typer.Option(0.5, "--mfu", help="Model FLOPs utilisation during prefill."),
        pool_a: str | None = typer.Option(None, "--pool-a", help="Compare only run A's requests on this replica, or "
                                                                  "on the replicas matching this glob (c-*): the "
                                                                  "control."),
        pool_b: str | None = typer.Option(None, "--pool-b", help="Only run B's requests on this replica or glob: "
                                                                  "the pilot. Give the same run twice for two pools "
                                                                  "of one log."),
        pilot: bool = typer.Option(False, "--pilot", help="Require the pilot comparison (TTFT and queue wait by "
                                                          "warm, partial, cold): a run without latency is an "
                                                          "error (exit 3). Implied by --pool-a / --pool-b."),
        json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but what --json asks for."),
    ) -> None:
        """What changed from run A to run B: hit rates under every definition, by tenant and prefix class,
        cache breakers fixed, new and remaining, and ideal-cache prefill (GPUs with --model and --rps). When
        either run carries latency, the pilot against the control: TTFT and queue wait p50 / p95, hit rate and
        prefill for all, warm, partial and cold requests (docs/pilot.md).

        Example: prefixscan diff runs/before runs/after --model llama-3.1-70b --rps 50
        Example: prefixscan diff runs/pool runs/pool --pool-a 'ctl-*' --pool-b 'pilot-*'
        """
        from prefixscan.compare.diff import diff_runs
        from prefixscan.report.compare_terminal import diff_json, render_diff

        result = diff_runs(run_a, run_b, model=model, gpu=gpu, rps=rps, dtype=dtype, mfu=mfu, pool_a=pool_a,
                           pool_b=pool_b, pilot=pilot)
        if json_or_quiet(json_out, quiet, diff_json(result)):
            return
        render_diff(result, stdout_console())
