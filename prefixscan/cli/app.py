"""The `prefixscan` typer application.

Command modules are imported here and each registers itself with `register(app)`. They must not import
polars, duckdb, transformers or numba at module top, so `prefixscan --help` stays fast.

`main` builds the application with only the command the command line names (typer turns every registered
command's signature into click options before it runs one, which costs time per command); `--help`, no
command or an unknown one get every command. `app` (for tests and `typer.testing`) is the full application.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import typer

# Command name -> its module (cli/<name, "-" as "_">.py), in the order `--help` lists them.
COMMANDS = {name: name.replace("-", "_") for name in (
    "analyze", "estimate", "query", "report", "synth", "simulate", "findings", "fix", "check", "diff", "export",
    "record-events", "explain")}
COMMAND_MODULES = list(COMMANDS.values())

HELP = "Measure prompt-prefix reuse in LLM request logs before you build a prefix-aware router."
EPILOG = ("Exit codes: 0 ok; 1 internal error (a bug); 2 usage; 3 input (unreadable, or no record accepted); "
          "4 a reject under --strict; 5 run directory (missing, damaged, or in use by another prefixscan); "
          "6 tokenizer; 7 environment (disk full, read-only file system, permission denied); 8 a check failed "
          "(`check`: a gate failed or could not be checked); 130 interrupted. "
          "Errors are one line on stderr (docs/analyze.md).")


def build_app(only: str | None = None) -> typer.Typer:
    """The application with every command, or with only the command named `only` (a key of COMMANDS;
    "": none, for `--version`)."""
    from typer.core import TyperCommand

    from prefixscan.cli.usage import HELP_WIDTH, Command, Group

    # plain help and one-line usage errors for every command (prefixscan/cli/usage.py)
    application = typer.Typer(name="prefixscan", help=HELP, no_args_is_help=True, add_completion=False,
                              rich_markup_mode=None, pretty_exceptions_enable=False, epilog=EPILOG, cls=Group,
                              context_settings={"max_content_width": HELP_WIDTH})
    for name in COMMANDS.values() if only is None else (COMMANDS[only],) if only else ():
        importlib.import_module(f"prefixscan.cli.{name}").register(application)
    for info in application.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = Command
    _hook_project_config(application)
    application.callback()(_root)
    return application


@functools.cache
def full_app() -> typer.Typer:
    """The application with every command (built once)."""
    return build_app()


def __getattr__(name: str) -> Any:
    if name == "app":  # built on first use: `python -m prefixscan analyze` never needs the other commands
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _scenario_keys() -> set[str]:
    """Option names of the commands that take the shared [scenario] table of prefixscan.toml."""
    import inspect

    from prefixscan.read.projectconfig import SCENARIO_COMMANDS

    # every registered command has a callback (hence the ignores)
    return {p for c in full_app().registered_commands if (c.name or c.callback.__name__) in SCENARIO_COMMANDS  # type: ignore[union-attr]
            for p in inspect.signature(c.callback).parameters}  # type: ignore[arg-type]


def _hook_project_config(application: typer.Typer) -> None:
    from prefixscan.cli.common import with_project_config
    from prefixscan.read.projectconfig import COMMANDS as CONFIGURED

    for info in application.registered_commands:
        name = info.name or info.callback.__name__  # type: ignore[union-attr]  # every command has a callback
        if name in CONFIGURED:
            info.callback = with_project_config(name, info.callback, _scenario_keys)  # type: ignore[type-var]  # likewise


def _version(value: bool) -> None:
    if value:
        from prefixscan.version import __version__

        typer.echo(__version__)
        raise typer.Exit()


def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                 callback=_version),
    config: str = typer.Option(None, "--config", help="Project settings file (default: prefixscan.toml beside "
                                                      "the logs, recorded in the run, or in this directory). Only "
                                                      "a file given here may set output, force, include_text, "
                                                      "snippet_k, engine, ray_address or reuse_temp_dir "
                                                      "(docs/config.md)."),
) -> None:
    """prefixscan: how much prefill repeats in your logs, what breaks it, and what routing would capture."""
    ctx.obj = {"config": config}


def command_named(args: list[str]) -> str | None:
    """The command `args` run (its first word after the root options), "" for `--version` without one, or
    None (build every command): no command, `--help`, or an unknown one."""
    version = False
    it = iter(args)
    for a in it:
        if a == "--help":
            return None
        if a == "--config":
            next(it, None)
        elif not a.startswith("-"):
            return a if a in COMMANDS else None
        version = version or a == "--version"
    return "" if version else None


def main() -> None:
    """The CLI (`python -m prefixscan`): parse, run the command, exit as Python does."""
    name = command_named(sys.argv[1:])
    (full_app() if name is None else build_app(name))()


def console() -> None:
    """The `prefixscan` command: `main`, then end the process without tearing the interpreter down.

    Freeing a large run's objects one by one (tokenizer memos, caches, frames, modules) takes a noticeable
    share of the run. By then every file the command writes is closed and renamed into place, and its worker
    processes and threads have ended. Threads are joined as the interpreter's exit would join them first
    (`_join_threads`: idle thread pools, such as the tokenizer's, are told to stop); the shortcut is then
    taken only when no other thread or child process is left, after stdout and stderr are flushed, with the
    command's exit code. What the run held is not even freed when its frames return (`startup.hold`): the
    process ends with it. `python -m prefixscan` (profilers, coverage) exits normally."""
    import logging
    import os
    import threading

    from prefixscan import startup

    startup.keep_until_exit()
    code: Any = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    _join_threads()
    if threading.active_count() > 1 or ("multiprocessing" in sys.modules and _children()):
        sys.exit(code)  # something still runs beside the command: the interpreter's own exit joins it
    if code is not None and not isinstance(code, int):  # what SystemExit does with a message
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): nothing more can be written anyway
            pass
    os._exit(code or 0)


def _join_threads() -> None:
    """What the interpreter's exit does first (`threading._shutdown`, as Python calls it): run threading's
    exit hooks (thread pools stop their idle workers) and join every non-daemon thread."""
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()


def _children() -> bool:
    import multiprocessing

    return bool(multiprocessing.active_children())
