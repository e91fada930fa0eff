"""The `prefixscan` typer application.

Command modules are imported here and each registers itself with `register(app)`. They must not import
polars, duckdb, transformers or numba at module top, so `prefixscan --help` stays fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="prefixscan",
    help="Measure prompt-prefix reuse in LLM request logs before you build a prefix-aware router.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    epilog="Exit codes: 0 ok; 1 internal error (a bug); 2 usage; 3 input (unreadable, or no record accepted); "
           "4 a reject under --strict; 5 run directory (missing, damaged, or in use by another prefixscan); "
           "6 tokenizer; 7 environment (disk full, read-only file system, permission denied); 130 interrupted. "
           "Errors are one line on stderr (docs/analyze.md).",
)

# One module per command, in the order `--help` lists them.
COMMAND_MODULES = [
    "analyze",
    "estimate",
    "query",
    "report",
    "synth",
    "simulate",
    "findings",
    "fix",
    "check",
    "diff",
    "export",
    "record_events",
    "explain",
]

for _name in COMMAND_MODULES:
    importlib.import_module(f"prefixscan.cli.{_name}").register(app)


def _scenario_keys() -> set[str]:
    """Option names of the commands that take the shared [scenario] table of prefixscan.toml."""
    import inspect

    from prefixscan.projectconfig import SCENARIO_COMMANDS

    return {p for c in app.registered_commands if (c.name or c.callback.__name__) in SCENARIO_COMMANDS
            for p in inspect.signature(c.callback).parameters}


def _hook_project_config() -> None:
    from prefixscan.cli.common import with_project_config
    from prefixscan.projectconfig import COMMANDS

    for info in app.registered_commands:
        name = info.name or info.callback.__name__
        if name in COMMANDS:
            info.callback = with_project_config(name, info.callback, _scenario_keys)


_hook_project_config()


def _version(value: bool) -> None:
    if value:
        from prefixscan import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                 callback=_version),
    config: str = typer.Option(None, "--config", help="Project settings file (default: prefixscan.toml beside "
                                                      "the logs, recorded in the run, or in this directory)."),
) -> None:
    """prefixscan: how much prefill repeats in your logs, what breaks it, and what routing would capture."""
    ctx.obj = {"config": config}


def main() -> None:
    """Console-script entry point."""
    app()
