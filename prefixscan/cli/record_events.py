"""`prefixscan record-events ENDPOINT -o EVENTS`: record a vLLM/SGLang KV-event publisher to Parquet."""

from __future__ import annotations

import typer

from prefixscan.cli.common import handle_errors, json_or_quiet


def register(app: typer.Typer) -> None:
    """Add the `record-events` command to the application."""

    @app.command("record-events", no_args_is_help=True)
    @handle_errors
    def record_events(
        endpoint: str = typer.Argument(..., help="The engine's KV-event PUB endpoint, e.g. tcp://127.0.0.1:5557."),
        output: str = typer.Option(..., "--output", "-o", help="Parquet file to write the events to."),
        replay: str = typer.Option(None, "--replay", help="The publisher's replay (ROUTER) endpoint, to ask "
                                                          "for batches lost in a sequence gap."),
        topic: str = typer.Option("", "--topic", help="Topic to subscribe to (vLLM's default is empty)."),
        duration: float = typer.Option(None, "--duration", help="Stop after this many seconds."),
        max_batches: int = typer.Option(None, "--max-batches", help="Stop after this many batches."),
        idle_timeout: float = typer.Option(None, "--idle-timeout",
                                           help="Stop when nothing arrived for this many seconds."),
        force: bool = typer.Option(False, "--force", help="Replace an existing output file."),
        json_out: bool = typer.Option(False, "--json", help="Print what was recorded as JSON on stdout."),
    ) -> None:
        """Subscribe to an engine's KV events (BlockStored, BlockRemoved, AllBlocksCleared) and write them.

        Sequence gaps are detected, asked for again from --replay when given, and listed in the file.
        Stops at --duration, --max-batches, --idle-timeout or Ctrl-C, and writes what arrived; nothing
        received is exit 3 and no file. Join the file
        with a run: prefixscan analyze LOGS --hash vllm:sha256 --hash-seed SEED -o RUN --kv-events EVENTS.
        Example: prefixscan record-events tcp://127.0.0.1:5557 -o events.parquet --idle-timeout 30
        """
        from prefixscan.evidence.record import record_events as _record

        r = _record(endpoint, output, replay, topic, duration, max_batches, idle_timeout, force)
        if json_or_quiet(json_out, False, r.to_json()):
            return
        typer.echo(f"wrote {r.path}: {r.batches:,} batches, {r.events:,} events in {r.seconds:.1f} s; "
                   f"{r.gaps} gap(s) ({r.missing} batches missing, {r.recovered} gap(s) filled by replay)"
                   + (f"; {r.bad_messages} undecodable message(s) skipped" if r.bad_messages else ""))
