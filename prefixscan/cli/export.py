"""`prefixscan export RUN --to mooncake|bailian -o FILE`: an anonymised trace for replay tools."""

from __future__ import annotations

import typer

from prefixscan.cli.common import handle_errors, json_or_quiet


def register(app: typer.Typer) -> None:
    """Add the `export` command to the application."""

    @app.command("export", no_args_is_help=True)
    @handle_errors
    def export(
        run_dir: str = typer.Argument(..., help="Run directory written by `prefixscan analyze -o` (text or hashed)."),
        to: str = typer.Option("mooncake", "--to", help="Trace format: mooncake (512-token blocks, ms timestamps) "
                                                       "or bailian (16-token blocks, chat_id/parent_chat_id/turn)."),
        output: str = typer.Option(..., "--output", "-o", help="The trace file to write (JSONL)."),
        block_size: int | None = typer.Option(None, "--block-size",
                                              help="Target block size (default: 512 mooncake, 16 bailian); a "
                                                   "multiple of the run's block size."),
        rate_scale: float = typer.Option(1.0, "--rate-scale",
                                         help="Compress the timeline: 2 = the same requests at twice the rate "
                                              "(timestamps divided by 2), as simulate --rate-scale."),
        force: bool = typer.Option(False, "--force", help="Replace an existing output file."),
        json_out: bool = typer.Option(False, "--json", help="Print what was written as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing on success but what --json asks for."),
    ) -> None:
        """Write the run's requests as a hashed trace (ids renumbered, relative timestamps, lengths only).

        No text, request ids or tenant names leave the run. The summary line gives the trace's own
        unbounded-cache reuse (AIPerf's mean per-request definition), which a replay should reproduce.
        When the format's block size keeps less than half of the run's reuse, a one-line warning names both.
        Example: prefixscan export runs/demo --to mooncake -o demo.mooncake.jsonl
        """
        from prefixscan.run.export import export_trace

        r = export_trace(run_dir, output, to, block_size, force, rate_scale)
        if not json_or_quiet(json_out, quiet, r.to_json()):
            typer.echo(f"wrote {r.path}: {r.requests:,} requests, {r.ids:,} block ids of {r.block_size} tokens "
                       f"({r.target}); unbounded-cache reuse in the trace: mean per request {r.request_mean:.4f}, "
                       f"block-weighted {r.block_weighted:.4f}"
                       + (f"; {r.own_tail_ids:,} partial last blocks got ids of their own" if r.own_tail_ids else "")
                       + (f"; timeline compressed {r.rate_scale:g}x" if r.rate_scale != 1 else ""))
        if r.warning and not quiet:
            typer.echo(f"prefixscan: warning: {r.warning}", err=True)
