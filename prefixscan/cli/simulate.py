"""`prefixscan simulate RUN_DIR`: replay the run's requests over N replicas under each routing policy.

`prefixscan simulate LOGS...`: a log is analysed first (into -o RUN_DIR, or a temporary run removed
afterwards) with the options that decide its requests table (`LogOptions`: tokenizer, block size, record
shape and field mapping, hashing, conversation inference). Given a run directory instead, those options are
refused: the run was analysed already, and its manifest says how.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import typer

from prefixscan.cli.common import handle_errors, safe, show_progress, stderr_console, stdout_console
from prefixscan.cli.estimate import one_rate, option_sources
from prefixscan.cli.groups import grouped
from prefixscan.cli.simulate_options import LogOptions, ReplayOptions, TierOptions
from prefixscan.errors import UsageError


def is_run(inputs: list[str]) -> bool:
    return len(inputs) == 1 and (Path(inputs[0]) / "manifest.json").exists()


def refuse_on_run(run: str, options: dict[str, Any]) -> None:
    """Analyze options with a run directory: a one-line error naming them and the run's own settings."""
    if not options:
        return
    from prefixscan.run.load import read_manifest

    cfg = read_manifest(run).get("config", {})
    given = ", ".join(LogOptions.flag_of(k) for k in options)
    had = f"tokenizer {cfg.get('tokenizer')}, block size {cfg.get('block_size')}"
    raise UsageError(f"options for logs ({given}) given with a run directory: {run} was analysed already "
                     f"({had}); re-run `prefixscan analyze` with them, or pass the logs to simulate")


def analyze_first(inputs: list[str], output: str | None, force: bool, quiet: bool, console: Any,
                  options: dict[str, Any]) -> tuple[str, str | None]:
    """Logs given instead of a run: analyse them into -o (or a temporary run that is removed after)."""
    import prefixscan

    tmp = None
    target = output
    if target is None:
        tmp = tempfile.mkdtemp(prefix="prefixscan-sim-")
        target = str(Path(tmp) / "run")
        if not quiet:
            console.print("analysing the logs first (pass -o RUN_DIR to keep the run and the sim tables)")
    prefixscan.analyze(*inputs, output=target, force=force, quiet=True, **options)
    return target, tmp


def register(app: typer.Typer) -> None:
    """Add the `simulate` command to the application."""

    @app.command("simulate", no_args_is_help=True)
    @handle_errors
    @grouped
    def simulate(
        inputs: list[str] = typer.Argument(..., help="A run directory, or log files to analyse first."),
        replay: ReplayOptions = ...,  # type: ignore[assignment]  # each group: its options (cli/groups.py)
        logs: LogOptions = ...,  # type: ignore[assignment]  # --- how LOGS are analysed first ---
        # --- where the simulation goes ---
        name: str = typer.Option(None, "--name", help="Store the simulation under this name beside the others "
                                                      "(default: 'default'; re-running a name replaces it). With "
                                                      "--load: which one to show."),
        list_sims: bool = typer.Option(False, "--list", help="List the run's stored simulations and exit."),
        output: str = typer.Option(None, "-o", "--output", help="Run directory to write when given logs."),
        force: bool = typer.Option(False, "--force", help="Replace an existing -o run directory."),
        save: bool = typer.Option(True, "--save/--no-save", help="Write the sim tables into the run directory."),
        load: bool = typer.Option(False, "--load", help="Re-render the run's saved simulation; do not re-run."),
        json_out: bool = typer.Option(False, "--json", help="Print the metrics as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress or table on stderr."),
        tiers: TierOptions = ...,  # type: ignore[assignment]  # --- KV tiers, disaggregation ---
    ) -> None:
        """Replay a run over N replicas with finite KV memory under each routing policy.

        Example: prefixscan simulate runs/demo --replicas 8 --policies all --kv-blocks 20000
        """
        from prefixscan.run.rundir import extending
        from prefixscan.run.simindex import check_name
        from prefixscan.sim import SimConfig, SimResult
        from prefixscan.sim import simulate as run_sim

        if name is not None:
            check_name(name)
        if list_sims:
            _list(inputs, json_out)
            return
        if load:
            _show(SimResult.load(inputs[0], name), json_out, quiet, stderr_console(quiet))
            return
        aopts = logs.analyze_options()
        rate = one_rate(replay.rps, replay.target_rps, "--target-rps",
                        option_sources(("rps", "target_rps"), {"rps": replay.rps, "target_rps": replay.target_rps}))
        cfg = SimConfig.from_options(**{**replay.sim_fields(rate), **tiers.sim_fields()})
        console = stderr_console(quiet)
        tmp: str | None = None
        run_path = inputs[0]
        try:
            if is_run(inputs):
                refuse_on_run(run_path, aopts)
            else:
                run_path, tmp = analyze_first(inputs, output, force, quiet, console, aopts)
            writing = save and tmp is None
            with extending(run_path) if writing else contextlib.nullcontext():  # the run's lock throughout
                if show_progress(quiet):
                    with console.status("simulating...") as status:
                        result = run_sim(run_path, cfg,
                                         progress=lambda n, i, k: status.update(f"policy {i + 1}/{k}: {n}..."))
                else:
                    result = run_sim(run_path, cfg)
                where = result.save(run_path, name or "default") if writing else None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        _show(result, json_out, quiet, console)
        if not quiet and where is not None:
            console.print(f"wrote simulation {safe(name or 'default')!r} (sim_policies, sim_replicas, sim_timeline"
                          f"{', sim_decisions' if cfg.decision_log else ''}) to {safe(str(where))}")


def _show(result: Any, json_out: bool, quiet: bool, console: Any) -> None:
    """JSON on stdout and/or the rendered tables (on stderr when stdout carries JSON)."""
    if json_out:
        typer.echo(result.dumps())
    if not quiet:
        from prefixscan.report.simulate_terminal import render

        render(result, stdout_console() if not json_out else console)


def _list(inputs: list[str], json_out: bool) -> None:
    """`simulate RUN --list`: the stored simulations, one line each (JSON with --json)."""
    from prefixscan.run.load import read_manifest
    from prefixscan.run.simindex import listing

    if len(inputs) != 1:
        raise UsageError("--list takes one run directory")
    rows = listing(read_manifest(inputs[0]), inputs[0])
    if json_out:
        import json

        typer.echo(json.dumps(rows, sort_keys=True))
        return
    from prefixscan.report.simulate_terminal import render_listing

    render_listing(rows, inputs[0], stdout_console())
